// Package buildinfo reports which relay this is: its version, the VCS
// commit it was built from and the Go version that built it.
package buildinfo

import (
	"runtime"
	"runtime/debug"
)

// version and commit are set at link time, for builds without the VCS
// metadata (a Docker build context has no .git):
//
//	go build -ldflags "-X github.com/outboxrelay/relay/internal/buildinfo.version=v1.2.3 \
//	  -X github.com/outboxrelay/relay/internal/buildinfo.commit=$(git rev-parse HEAD)"
var version, commit string

// Info describes a build.
type Info struct {
	Version   string // the version set at link time, else the main module's ("(devel)" when unknown)
	Commit    string // the commit set at link time, else vcs.revision (with "-dirty" for local changes), else "unknown"
	GoVersion string // the Go version that built the binary, like go1.26.0
}

// Read returns the build's Info: what the linker set (version, commit),
// completed from the build information Go embeds in the binary.
func Read() Info {
	bi, _ := debug.ReadBuildInfo()
	return fromBuildInfo(bi, version, commit)
}

// fromBuildInfo fills Info from the link-time values and bi, which may be
// nil.
func fromBuildInfo(bi *debug.BuildInfo, version, commit string) Info {
	info := Info{Version: version, Commit: commit, GoVersion: runtime.Version()}
	if bi != nil {
		info.GoVersion = bi.GoVersion
		if info.Version == "" {
			info.Version = bi.Main.Version
		}
		if info.Commit == "" {
			info.Commit = vcsCommit(bi.Settings)
		}
	}
	if info.Version == "" {
		info.Version = "(devel)"
	}
	if info.Commit == "" {
		info.Commit = "unknown"
	}
	return info
}

// vcsCommit returns the vcs.revision setting, with "-dirty" when
// vcs.modified is true, or "" without one.
func vcsCommit(settings []debug.BuildSetting) string {
	var rev, modified string
	for _, s := range settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			modified = s.Value
		}
	}
	if rev != "" && modified == "true" {
		rev += "-dirty"
	}
	return rev
}
