package buildinfo

import (
	"runtime/debug"
	"testing"
)

func TestFromBuildInfo(t *testing.T) {
	stamped := &debug.BuildInfo{
		GoVersion: "go1.26.0",
		Main:      debug.Module{Path: "github.com/outboxrelay/relay", Version: "v0.2.1-0.20261201045500-890d676abcde"},
		Settings: []debug.BuildSetting{
			{Key: "vcs", Value: "git"},
			{Key: "vcs.revision", Value: "890d676abcdef"},
			{Key: "vcs.modified", Value: "false"},
		},
	}
	dirty := &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "(devel)"},
		Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "abc"}, {Key: "vcs.modified", Value: "true"}}}
	noVCS := &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "(devel)"}}
	for _, tc := range []struct {
		name            string
		bi              *debug.BuildInfo
		version, commit string
		want            Info
	}{
		{"vcs stamped", stamped, "", "", Info{"v0.2.1-0.20261201045500-890d676abcde", "890d676abcdef", "go1.26.0"}},
		{"local changes", dirty, "", "", Info{"(devel)", "abc-dirty", "go1.26.0"}},
		{"linker values win", stamped, "v1.2.3", "feedface", Info{"v1.2.3", "feedface", "go1.26.0"}},
		{"docker build without .git", noVCS, "v1.2.3", "feedface", Info{"v1.2.3", "feedface", "go1.26.0"}},
		{"nothing known", noVCS, "", "", Info{"(devel)", "unknown", "go1.26.0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := fromBuildInfo(tc.bi, tc.version, tc.commit); got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
	if got := fromBuildInfo(nil, "", ""); got.Version != "(devel)" || got.Commit != "unknown" || got.GoVersion == "" {
		t.Errorf("without build info: %+v", got)
	}
}
