package cdc

import (
	"context"
	"log/slog"

	"github.com/retinadb/retina/internal/catalog"
)

// Catalog is what a database source (PostgreSQL, MySQL) needs of Retina's
// catalog: it creates a table for every source table before the first
// change of it is delivered, and adds the columns the source adds.
type Catalog interface {
	Snapshot() *catalog.Snapshot
	CreateTable(ctx context.Context, name string, schema catalog.Schema) (*catalog.Table, error)
	AddColumn(ctx context.Context, tableID uint32, col catalog.Column) (*catalog.Table, error)
}

// DatabaseConfig is what a database source needs besides its URI.
type DatabaseConfig struct {
	Catalog Catalog
	Logger  *slog.Logger
	// Resume is this source's resume point from the replay checkpoint.
	Resume map[string]int64
}
