package memengine

import (
	"testing"

	"github.com/retinadb/retina/internal/oltp/engine"
	"github.com/retinadb/retina/internal/oltp/enginetest"
)

func TestConformance(t *testing.T) {
	enginetest.Run(t, func(dir string, tables []engine.TableSpec) (enginetest.Opened, error) {
		return Open(Options{Dir: dir, Tables: tables})
	})
}
