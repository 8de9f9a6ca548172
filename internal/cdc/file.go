package cdc

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"time"
)

// FileOptions tune a file source.
type FileOptions struct {
	// Follow keeps reading the last file as it grows (like tail -f) instead
	// of ending with io.EOF.
	Follow bool
	// Poll is how often a followed file is checked for new lines (10ms).
	Poll time.Duration
	// Resume maps streams to the first line still to deliver; earlier lines
	// are skipped (they were applied before a restart).
	Resume map[string]int64
	// Stdin is read for the path "-" (tests substitute it).
	Stdin io.Reader
}

// FileSource reads newline-delimited JSON: each line is a Debezium value, or
// {"key": …, "value": …}. A directory is read file by file in name order.
// Positions are (file, line), lines counted from 1.
type FileSource struct {
	files  []string
	opts   FileOptions
	cur    int
	f      io.ReadCloser
	r      *bufio.Reader
	stream string
	line   int64
	carry  []byte // a partial last line while following
	arena  []byte // messages' bytes are cut from here: one allocation per arenaSize
}

// arenaSize is how much line text one allocation holds. A message keeps its
// arena alive until it is decoded; lines are short-lived, so that is brief.
const arenaSize = 64 << 10

// keep copies a line into the arena; the result's capacity ends with it.
func (s *FileSource) keep(line []byte) []byte {
	if len(line) > cap(s.arena)-len(s.arena) {
		s.arena = make([]byte, 0, max(arenaSize, len(line)))
	}
	start := len(s.arena)
	s.arena = append(s.arena, line...)
	return s.arena[start:len(s.arena):len(s.arena)]
}

// OpenFileSource opens a file, a directory of files, or "-" for stdin.
func OpenFileSource(path string, opts FileOptions) (*FileSource, error) {
	if opts.Poll <= 0 {
		opts.Poll = 10 * time.Millisecond
	}
	s := &FileSource{opts: opts}
	if path == "-" {
		s.files = []string{"-"}
		return s, nil
	}
	info, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("cdc: file source: %w", err)
	}
	if !info.IsDir() {
		s.files = []string{filepath.Clean(path)}
		return s, nil
	}
	entries, err := os.ReadDir(path)
	if err != nil {
		return nil, fmt.Errorf("cdc: file source: %w", err)
	}
	for _, e := range entries {
		if !e.IsDir() && !isHidden(e.Name()) {
			s.files = append(s.files, filepath.Join(filepath.Clean(path), e.Name()))
		}
	}
	sort.Strings(s.files)
	if len(s.files) == 0 {
		return nil, fmt.Errorf("cdc: file source: no files in %s", path)
	}
	return s, nil
}

// isHidden tells hidden files (editors' swap files and the like).
func isHidden(name string) bool { return len(name) > 0 && name[0] == '.' }

func (s *FileSource) open() error {
	name := s.files[s.cur]
	s.stream, s.line, s.carry = "file:"+name, 0, nil
	if name == "-" {
		in := s.opts.Stdin
		if in == nil {
			in = os.Stdin
		}
		s.stream = "stdin"
		s.f, s.r = io.NopCloser(in), bufio.NewReaderSize(in, 1<<20)
		return nil
	}
	f, err := os.Open(name)
	if err != nil {
		return fmt.Errorf("cdc: file source: %w", err)
	}
	s.f, s.r = f, bufio.NewReaderSize(f, 1<<20)
	return nil
}

// Next returns the next non-empty line.
func (s *FileSource) Next(ctx context.Context) (Message, error) {
	for {
		if err := ctx.Err(); err != nil {
			return Message{}, err
		}
		if s.r == nil {
			if s.cur >= len(s.files) {
				return Message{}, io.EOF
			}
			if err := s.open(); err != nil {
				return Message{}, err
			}
		}
		chunk, err := s.r.ReadSlice('\n') // a view of the reader's buffer
		line := chunk
		if err != nil || len(s.carry) > 0 {
			// Not a whole line in one piece (the usual case, copied once:
			// into the arena): gather it in carry.
			s.carry = append(s.carry, chunk...)
			switch {
			case err == nil: // a whole line
			case errors.Is(err, bufio.ErrBufferFull): // a line longer than the buffer
				continue
			case errors.Is(err, io.EOF):
				last := s.cur == len(s.files)-1
				if last && s.opts.Follow {
					select { // wait for the writer to add more
					case <-ctx.Done():
						return Message{}, ctx.Err()
					case <-time.After(s.opts.Poll):
					}
					continue
				}
				if len(s.carry) == 0 {
					s.f.Close()
					s.r = nil
					s.cur++
					continue
				}
				// A last line without a newline still counts.
			default:
				return Message{}, fmt.Errorf("cdc: read %s: %w", s.stream, err)
			}
			line = s.carry
			s.carry = s.carry[:0]
		}
		line = bytes.TrimSpace(line)
		s.line++
		if len(line) == 0 || s.line < s.opts.Resume[s.stream] {
			continue
		}
		return Message{Pos: Position{Stream: s.stream, Offset: s.line}, Value: s.keep(line)}, nil
	}
}

// Commit is a no-op: files are re-read from the checkpoint's positions.
func (s *FileSource) Commit(context.Context, map[string]int64) error { return nil }

// Close closes the current file.
func (s *FileSource) Close() error {
	if s.f != nil {
		return s.f.Close()
	}
	return nil
}
