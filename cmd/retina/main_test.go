package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestVersionCommand(t *testing.T) {
	var out bytes.Buffer
	root := newRootCommand()
	root.SetOut(&out)
	root.SetArgs([]string{"version"})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out.String(), "retina ") || !strings.Contains(out.String(), "go1.") {
		t.Fatalf("version output %q", out.String())
	}
}

func TestUnknownCommandFails(t *testing.T) {
	root := newRootCommand()
	root.SetOut(&bytes.Buffer{})
	root.SetErr(&bytes.Buffer{})
	root.SetArgs([]string{"no-such-command"})
	if err := root.Execute(); err == nil {
		t.Fatal("unknown command accepted")
	}
}
