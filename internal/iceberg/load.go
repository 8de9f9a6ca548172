package iceberg

import (
	"bytes"
	"context"
	"fmt"
	"strings"

	ice "github.com/apache/iceberg-go"
	"github.com/apache/iceberg-go/table"
)

// loadTable reads a table's current metadata and the manifests of its
// retained snapshots: which objects they name, and the files of the
// current one. Pieces come back without their segments and the masked
// positions as unknown: every virtual file a piece held rows of is regular
// after the restart, so the next publication drops the pieces and writes
// the delete information anew.
func (p *Publisher) loadTable(ctx context.Context, rt recordTable) (*tableState, error) {
	data, err := p.cfg.Lake.Get(ctx, rt.Metadata)
	if err != nil {
		return nil, fmt.Errorf("read metadata %s: %w", rt.Metadata, err)
	}
	md, err := table.ParseMetadataBytes(data)
	if err != nil {
		return nil, fmt.Errorf("metadata %s: %w", rt.Metadata, err)
	}
	dir, ok := strings.CutSuffix(rt.Metadata, fmt.Sprintf("/metadata/v%d.metadata.json", rt.Version))
	if !ok {
		return nil, fmt.Errorf("metadata %s is not version %d of a table's metadata", rt.Metadata, rt.Version)
	}
	t := &tableState{TableID: rt.TableID, Namespace: rt.Namespace, Name: rt.Name, Dir: dir, Location: md.Location(), Format: md.Version(),
		Meta: md, MetaKey: rt.Metadata, Version: rt.Version, metaJSON: data,
		Data: map[string]*entry{}, Upto: map[uint64]int64{}, DVs: map[string]*entry{}, Refs: map[int64][]string{}}
	manifests := map[string][]ice.ManifestEntry{}
	cur := md.CurrentSnapshot()
	for _, s := range md.Snapshots() {
		listKey, err := p.keyOf(s.ManifestList)
		if err != nil {
			return nil, err
		}
		list, err := p.cfg.Lake.Get(ctx, listKey)
		if err != nil {
			return nil, fmt.Errorf("snapshot %d: manifest list: %w", s.SnapshotID, err)
		}
		mfs, err := ice.ReadManifestList(bytes.NewReader(list))
		if err != nil {
			return nil, fmt.Errorf("snapshot %d: manifest list %s: %w", s.SnapshotID, listKey, err)
		}
		refs := []string{listKey}
		for _, mf := range mfs {
			key, err := p.keyOf(mf.FilePath())
			if err != nil {
				return nil, err
			}
			entries, ok := manifests[key]
			if !ok {
				raw, err := p.cfg.Lake.Get(ctx, key)
				if err != nil {
					return nil, fmt.Errorf("snapshot %d: manifest: %w", s.SnapshotID, err)
				}
				if entries, err = ice.ReadManifest(mf, bytes.NewReader(raw), true); err != nil {
					return nil, fmt.Errorf("snapshot %d: manifest %s: %w", s.SnapshotID, key, err)
				}
				manifests[key] = entries
			}
			refs = append(refs, key)
			var files []*entry
			for _, me := range entries {
				k, err := p.keyOf(me.DataFile().FilePath())
				if err != nil {
					return nil, err
				}
				refs = append(refs, k)
				files = append(files, entryOf(me, k))
			}
			if cur == nil || s.SnapshotID != cur.SnapshotID {
				continue
			}
			switch mf.ManifestContent() {
			case ice.ManifestContentData:
				t.DataManifest, t.dataSet = mf, fingerprint(files)
				for _, e := range files {
					t.Data[e.Path] = e
					if strings.HasPrefix(e.Key, dir+"/data/p-") {
						t.Pieces = append(t.Pieces, &piece{entry: e})
					}
				}
			case ice.ManifestContentDeletes:
				t.DeleteManifest, t.deleteSet = mf, fingerprint(files)
				for _, e := range files {
					if e.Format == ice.PuffinFile {
						t.DVs[e.Referenced] = e
					} else {
						t.Deletes = append(t.Deletes, &deleteFile{entry: e})
					}
				}
			}
		}
		t.Refs[s.SnapshotID] = refs
	}
	return t, nil
}
