// Package buildinfo reports what binary is running: version, commit, Go.
package buildinfo

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Version is set at link time with -ldflags "-X github.com/retinadb/retina/internal/buildinfo.Version=v1.2.3".
var Version = "dev"

// Info describes the running binary.
type Info struct {
	Version   string
	Commit    string
	Modified  bool
	GoVersion string
	Platform  string
}

// Read collects the build information embedded by the Go toolchain.
func Read() Info {
	info := Info{Version: Version, GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				info.Commit = s.Value
			case "vcs.modified":
				info.Modified = s.Value == "true"
			}
		}
	}
	return info
}

func (i Info) String() string {
	commit := i.Commit
	if commit == "" {
		commit = "unknown"
	} else if len(commit) > 12 {
		commit = commit[:12]
	}
	if i.Modified {
		commit += "+modified"
	}
	return fmt.Sprintf("retina %s (commit %s, %s, %s)", i.Version, commit, i.GoVersion, i.Platform)
}
