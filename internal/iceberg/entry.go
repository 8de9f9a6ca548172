package iceberg

import (
	"fmt"

	ice "github.com/apache/iceberg-go"
)

// entry is one data or delete file of a table's current snapshot, with the
// manifest fields it keeps from the snapshot that added it.
type entry struct {
	Path    string // absolute URI, as readers open it
	Key     string // lake key
	Content ice.ManifestEntryContent
	Format  ice.FileFormat
	Records int64
	Size    int64
	// Snapshot added the file; Seq is its data sequence number.
	Snapshot, Seq int64
	// FirstRowID is the first row id of a data file (format version 3),
	// known once the manifest list that first named it is written.
	FirstRowID *int64
	// A deletion vector's data file and its blob in the Puffin file.
	Referenced     string
	Offset, Length int64
}

// dataFile builds the manifest's description of the file.
func (e *entry) dataFile() (ice.DataFile, error) {
	b, err := ice.NewDataFileBuilder(*ice.UnpartitionedSpec, e.Content, e.Path, e.Format, nil, nil, nil, e.Records, e.Size)
	if err != nil {
		return nil, fmt.Errorf("iceberg: describe %s: %w", e.Path, err)
	}
	if e.FirstRowID != nil {
		b.FirstRowID(*e.FirstRowID)
	}
	if e.Referenced != "" {
		b.ReferencedDataFile(e.Referenced).ContentOffset(e.Offset).ContentSizeInBytes(e.Length)
	}
	return b.Build(), nil
}

// manifestEntry is the file's entry in a manifest of snapshot snap: added
// by it, or existing since an earlier one.
func (e *entry) manifestEntry(snap int64) (ice.ManifestEntry, error) {
	df, err := e.dataFile()
	if err != nil {
		return nil, err
	}
	status := ice.EntryStatusEXISTING
	if e.Snapshot == snap {
		status = ice.EntryStatusADDED
	}
	s, seq := e.Snapshot, e.Seq
	return ice.NewManifestEntry(status, &s, &seq, &seq, df), nil
}

// entryOf reads an entry back from a manifest.
func entryOf(me ice.ManifestEntry, key string) *entry {
	df := me.DataFile()
	e := &entry{Path: df.FilePath(), Key: key, Content: df.ContentType(), Format: df.FileFormat(),
		Records: df.Count(), Size: df.FileSizeBytes(), Snapshot: me.SnapshotID(), Seq: me.SequenceNum()}
	if id := df.FirstRowID(); id != nil {
		v := *id
		e.FirstRowID = &v
	}
	if r := df.ReferencedDataFile(); r != nil {
		e.Referenced = *r
	}
	if o := df.ContentOffset(); o != nil {
		e.Offset = *o
	}
	if n := df.ContentSizeInBytes(); n != nil {
		e.Length = *n
	}
	return e
}
