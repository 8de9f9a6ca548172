package query

import (
	"fmt"
	"runtime"

	"github.com/retinadb/retina/internal/buildinfo"
)

// The PostgreSQL release whose protocol, catalogs and names the endpoint
// follows; drivers choose features by it.
const (
	pgMajor          = "15"
	ServerVersionNum = "150000"
)

// ServerVersion is server_version as PostgreSQL forms it ("15.0 (Debian
// …)"), naming Retina's build in the parentheses.
var ServerVersion = pgMajor + ".0 (Retina " + buildinfo.Version + ")"

// versionString is what version() returns, in PostgreSQL's form.
func versionString() string {
	return fmt.Sprintf("PostgreSQL %s.0 (Retina %s) on %s, compiled by %s, 64-bit", pgMajor, buildinfo.Version, runtime.GOARCH+"-"+runtime.GOOS, runtime.Version())
}
