package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/retinadb/retina/internal/server"
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

// TestServeFlagsOverrideOnlyWhenGiven: a flag left at its default must not
// undo the config file or the environment.
func TestServeFlagsOverrideOnlyWhenGiven(t *testing.T) {
	cmd := newServeCommand()
	if err := cmd.Flags().Parse([]string{"--data", "/flag/data", "--source", "file:/a", "--source", "file:/b"}); err != nil {
		t.Fatal(err)
	}
	cfg := server.DefaultConfig()
	cfg.SQLAddr = "127.0.0.1:7000" // from the environment, say
	cfg.DataDir = "/env/data"
	flagCfg := server.DefaultConfig()
	flagCfg.DataDir, flagCfg.Sources = "/flag/data", []string{"file:/a", "file:/b"}
	applyChangedFlags(cmd.Flags(), &cfg, flagCfg)
	if cfg.DataDir != "/flag/data" || cfg.SQLAddr != "127.0.0.1:7000" || len(cfg.Sources) != 2 {
		t.Fatalf("merged config: %+v", cfg)
	}
}
