package server

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestConfigLayers(t *testing.T) {
	path := filepath.Join(t.TempDir(), "retina.yaml")
	os.WriteFile(path, []byte(`
data: /srv/retina
sources: [file:/a.jsonl, "kafka://127.0.0.1:9092?topics=t"]
sql_addr: 127.0.0.1:6000
replayers: 3
tables:
  - name: account
    primary_key: [id]
    columns:
      - {name: id, type: int64}
      - {name: balance, type: "decimal(15,2)", nullable: true}
`), 0o644)
	c := DefaultConfig()
	if err := c.LoadFile(path); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"RETINA_SQL_ADDR": "127.0.0.1:7000", "RETINA_BUCKETS": "8", "RETINA_SOURCE": "file:/x,file:/y"}
	if err := c.ApplyEnv(func(k string) string { return env[k] }); err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.DataDir != "/srv/retina" || c.SQLAddr != "127.0.0.1:7000" || c.Replayers != 3 || c.Buckets != 8 ||
		c.HTTPAddr != "127.0.0.1:9187" || strings.Join(c.Sources, " ") != "file:/x file:/y" {
		t.Fatalf("layered config: %+v", c)
	}
	sc, err := c.Tables[0].schema()
	if err != nil || len(sc.Columns) != 2 || !sc.Columns[1].Nullable || sc.Columns[1].Type.Scale != 2 {
		t.Fatalf("table: %+v %v", sc, err)
	}
}

func TestConfigRejectsBadInput(t *testing.T) {
	dir := t.TempDir()
	unknown := filepath.Join(dir, "unknown.yaml")
	os.WriteFile(unknown, []byte("sql_adr: 127.0.0.1:1\n"), 0o644)
	c := DefaultConfig()
	if err := c.LoadFile(unknown); err == nil || !strings.Contains(err.Error(), "sql_adr") {
		t.Fatalf("misspelt key: %v", err)
	}
	for name, mod := range map[string]func(*Config){
		"source_eof": func(c *Config) { c.SourceEOF = "rewind" },
		"log_format": func(c *Config) { c.LogFormat = "xml" },
		"index":      func(c *Config) { c.IndexBackend = "rocks" },
		"bad_input":  func(c *Config) { c.BadInput = "ignore" },
		"dead_letter": func(c *Config) {
			c.BadInput = "dead-letter"
		},
		"replayers":           func(c *Config) { c.Replayers = 0 },
		"sql_tls_key missing": func(c *Config) { c.SQLTLSCert = "cert.pem" },
		"sql_tls_required":    func(c *Config) { c.SQLTLSRequired = true },
		"sql_users empty":     func(c *Config) { c.SQLUsers = []SQLUser{{Name: "alice"}} },
		"sql_users twice":     func(c *Config) { c.SQLUsers = []SQLUser{{"a", "x"}, {"a", "y"}} },
		"sql_users verifier":  func(c *Config) { c.SQLUsers = []SQLUser{{"a", "SCRAM-SHA-256$4096:xx"}} },
		"column type": func(c *Config) {
			c.Tables = []TableDecl{{Name: "t", PrimaryKey: []string{"id"}, Columns: []ColumnDecl{{Name: "id", Type: "integer128"}}}}
		},
	} {
		c := DefaultConfig()
		mod(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s: invalid config accepted", name)
		}
	}
	c = DefaultConfig()
	if err := c.ApplyEnv(func(k string) string {
		if k == "RETINA_REPLAYERS" {
			return "two"
		}
		return ""
	}); err == nil {
		t.Error("RETINA_REPLAYERS=two accepted")
	}
	c = DefaultConfig()
	if err := c.ApplyEnv(func(k string) string { return map[string]string{"RETINA_SQL_USER": "alice"}[k] }); err == nil {
		t.Error("RETINA_SQL_USER without RETINA_SQL_PASSWORD accepted")
	}
	c = DefaultConfig()
	env := map[string]string{"RETINA_SQL_USER": "alice", "RETINA_SQL_PASSWORD": "pw", "RETINA_SQL_TLS_REQUIRED": "true"}
	if err := c.ApplyEnv(func(k string) string { return env[k] }); err != nil || len(c.SQLUsers) != 1 || !c.SQLTLSRequired {
		t.Errorf("SQL user from the environment: %v %+v", err, c.SQLUsers)
	}
}
