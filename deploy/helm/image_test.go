package helm_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// root is the repository's root, with the Makefile and the Dockerfile.
var root = filepath.Join("..", "..")

// release matches a release version as the chart's appVersion, the image's
// tag and `relay version` give it.
var release = regexp.MustCompile(`^v(\d+)\.(\d+)\.(\d+)$`)

// TestImageVersion checks that the chart's default image is the release
// image `make image` pushes: the tag is appVersion, a release version that
// is either the CHANGELOG's newest release or, while its Unreleased section
// is being prepared, above every released one; make image tags and
// pushes that version for linux/amd64 and linux/arm64.
func TestImageVersion(t *testing.T) {
	t.Parallel()
	v := appVersion(t)
	if !release.MatchString(v) {
		t.Fatalf("Chart.yaml appVersion %q: want a release version vX.Y.Z, the image's tag", v)
	}
	r := render(t, "")
	if image := r.deployment.Spec.Template.Spec.Containers[0].Image; image != "outboxrelay/relay:"+v {
		t.Errorf("default image %s, want outboxrelay/relay:%s", image, v)
	}
	log, err := os.ReadFile(filepath.Join(root, "CHANGELOG.md"))
	if err != nil {
		t.Fatal(err)
	}
	released := regexp.MustCompile(`(?m)^## \[(\d+\.\d+\.\d+)\]`).FindAllStringSubmatch(string(log), -1)
	switch {
	case len(released) > 0 && "v"+released[0][1] == v:
	case !strings.Contains(string(log), "\n## [Unreleased]"):
		t.Errorf("appVersion %s is not the CHANGELOG's newest release %v, and there is no Unreleased section", v, released)
	default:
		for _, m := range released {
			if !newer(v, "v"+m[1]) {
				t.Errorf("appVersion %s, the next release, is not above the released %s", v, m[1])
			}
		}
	}
	out, err := exec.Command("make", "-s", "-C", root, "-n", "image", "COMMIT=c0ffee").CombinedOutput()
	if err != nil {
		t.Fatalf("make -n image: %v\n%s", err, out)
	}
	for _, want := range []string{"docker buildx build ", "--platform linux/amd64,linux/arm64 ", "--build-arg VERSION=" + v + " ",
		"--build-arg COMMIT=c0ffee ", "-t outboxrelay/relay:" + v + " ", "--push ."} {
		if !strings.Contains(strings.Join(strings.Fields(string(out)), " ")+" ", want) {
			t.Errorf("make image runs %q, without %q", out, want)
		}
	}
}

// newer reports whether release version a is above b.
func newer(a, b string) bool {
	ma, mb := release.FindStringSubmatch(a), release.FindStringSubmatch(b)
	for i := 1; i <= 3; i++ {
		x, _ := strconv.Atoi(ma[i])
		y, _ := strconv.Atoi(mb[i])
		if x != y {
			return x > y
		}
	}
	return false
}

// TestImageBuild checks what can be checked of the image without a Docker
// engine: the Dockerfile's builder stage runs the Makefile's build
// (BUILD_FLAGS, make binaries), and the image runs as a numeric non-root
// user, which runAsNonRoot without runAsUser needs. The linux/arm64 build
// itself is a step of .ci/run, outside make test: compiling every
// dependency for a second architecture costs minutes on a cold cache.
func TestImageBuild(t *testing.T) {
	t.Parallel()
	docker, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	text := strings.ReplaceAll(string(docker), "\\\n", " ")
	build := regexp.MustCompile(`go build (.*) -o /out/relay \./cmd/relay`).FindStringSubmatch(text)
	if build == nil {
		t.Fatal("Dockerfile: no `go build FLAGS -o /out/relay ./cmd/relay`")
	}
	dockerFlags := strings.NewReplacer("${VERSION}", "v9.9.9", "${COMMIT}", "c0ffee").Replace(strings.Join(strings.Fields(build[1]), " "))
	out, err := exec.Command("make", "-s", "-C", root, "-n", "binaries", "VERSION=v9.9.9", "COMMIT=c0ffee").CombinedOutput()
	if err != nil {
		t.Fatalf("make -n binaries: %v\n%s", err, out)
	}
	makeBuild := regexp.MustCompile(`go build (.*) -o \S+ \./cmd/relay`).FindStringSubmatch(strings.Join(strings.Fields(string(out)), " "))
	if makeBuild == nil || makeBuild[1] != dockerFlags {
		t.Errorf("the Dockerfile builds with %q, make binaries with %q", dockerFlags, makeBuild)
	}
	if !strings.Contains(text, "CGO_ENABLED=0") || !strings.Contains(string(out), "CGO_ENABLED=0") {
		t.Error("the Dockerfile and make binaries should both build with CGO_ENABLED=0")
	}
	users := regexp.MustCompile(`(?m)^USER\s+(\S+)`).FindAllStringSubmatch(string(docker), -1)
	if len(users) == 0 || !regexp.MustCompile(`^[1-9][0-9]*(:[0-9]+)?$`).MatchString(users[len(users)-1][1]) {
		t.Errorf("Dockerfile: USER %v: want a numeric non-root uid, so that runAsNonRoot can check it", users)
	}

}
