// Package bench runs Retina's named benchmarks and reports their figures:
// human-readable lines while running, then one JSON object as the last line.
package bench

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"runtime"
)

// Report collects the figures of one benchmark run in the order they are set.
type Report struct {
	w       io.Writer
	keys    []string
	figures map[string]any
}

// NewReport starts a report that prints progress lines to w.
func NewReport(w io.Writer, name string) *Report {
	r := &Report{w: w, figures: map[string]any{}}
	r.Set("benchmark", name)
	r.Set("go_version", runtime.Version())
	r.Set("gomaxprocs", runtime.GOMAXPROCS(0))
	return r
}

// Printf writes one human-readable line.
func (r *Report) Printf(format string, args ...any) {
	fmt.Fprintf(r.w, format+"\n", args...)
}

// Set records a named figure; setting a name again replaces its value.
func (r *Report) Set(key string, value any) {
	if _, ok := r.figures[key]; !ok {
		r.keys = append(r.keys, key)
	}
	r.figures[key] = value
}

// Get returns a recorded figure.
func (r *Report) Get(key string) (any, bool) {
	v, ok := r.figures[key]
	return v, ok
}

// JSON encodes the figures as one object, keys in the order they were set.
func (r *Report) JSON() ([]byte, error) {
	var buf bytes.Buffer
	buf.WriteByte('{')
	for i, k := range r.keys {
		if i > 0 {
			buf.WriteByte(',')
		}
		kb, err := json.Marshal(k)
		if err != nil {
			return nil, err
		}
		vb, err := json.Marshal(r.figures[k])
		if err != nil {
			return nil, fmt.Errorf("figure %s: %w", k, err)
		}
		buf.Write(kb)
		buf.WriteByte(':')
		buf.Write(vb)
	}
	buf.WriteByte('}')
	return buf.Bytes(), nil
}

// Finish writes the JSON object as the last line.
func (r *Report) Finish() error {
	b, err := r.JSON()
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(r.w, "%s\n", b)
	return err
}
