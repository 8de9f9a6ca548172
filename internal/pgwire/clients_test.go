package pgwire_test

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/apache/arrow-go/v18/arrow/decimal128"

	"github.com/retinadb/retina/internal/catalog"
	"github.com/retinadb/retina/internal/change"
	"github.com/retinadb/retina/internal/pgtest"
	"github.com/retinadb/retina/internal/pgwire"
	"github.com/retinadb/retina/internal/server"
	"github.com/retinadb/retina/internal/server/servertest"
	"github.com/retinadb/retina/internal/types"
)

var rewrite = flag.Bool("rewrite", false, "rewrite the expected client outputs in testdata/clients")

const (
	compatUser     = "alice"
	compatPassword = "compat pass"
)

// decimalAccountCols is account with a numeric(12,2) balance, as the
// client and differential tests load it.
func decimalAccountCols() []catalog.Column {
	return []catalog.Column{
		{Name: "id", Type: types.Of(types.Int64)},
		{Name: "owner", Type: types.Of(types.String), Nullable: true},
		{Name: "balance", Type: types.DecimalOf(12, 2)},
	}
}

// compatServer serves ten accounts and ten orders, with a password.
func compatServer(t *testing.T) (host, port string) {
	t.Helper()
	n := servertest.OpenNode(t)
	acct := servertest.CreateTable(t, n, "account", decimalAccountCols(), "id")
	ord := servertest.CreateTable(t, n, "orders", []catalog.Column{
		{Name: "oid", Type: types.Of(types.Int64)},
		{Name: "account_id", Type: types.Of(types.Int64)},
		{Name: "amount", Type: types.DecimalOf(10, 2)},
		{Name: "placed", Type: types.Of(types.Timestamp)},
	}, "oid")
	var ops []change.Op
	base := time.Date(2024, 1, 1, 12, 0, 0, 0, time.UTC)
	for i := range 10 {
		var owner any = fmt.Sprintf("o%d", i%3)
		if i%4 == 3 {
			owner = nil
		}
		bal, _ := decimal128.FromString(fmt.Sprintf("%d.25", i*100), 12, 2)
		amt, _ := decimal128.FromString(fmt.Sprintf("%d.50", i*7), 10, 2)
		ops = append(ops,
			change.Op{Table: acct.ID, Kind: change.Insert, Row: []any{int64(i), owner, bal}},
			change.Op{Table: ord.ID, Kind: change.Insert, Row: []any{int64(i), int64(i % 4), amt, types.TimestampMicros(base.AddDate(0, 0, i).UnixMicro())}})
	}
	servertest.Apply(t, n, ops...)
	return compatServe(t, n)
}

func compatServe(t *testing.T, n *server.Node) (string, string) {
	users := pgwire.Users{}
	if err := users.AddUser(compatUser, compatPassword); err != nil {
		t.Fatal(err)
	}
	host, port, _ := net.SplitHostPort(serveWith(t, n, pgwire.Options{Users: users}))
	return host, port
}

// checkOutput compares a client's output with testdata/clients/NAME.txt.
func checkOutput(t *testing.T, name string, out []byte) {
	t.Helper()
	path := filepath.Join("testdata", "clients", name+".txt")
	if *rewrite {
		if err := os.WriteFile(path, out, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(out) != string(want) {
		t.Fatalf("%s printed:\n%s\nwant (%s):\n%s", name, out, path, want)
	}
}

func pgEnv(host, port string) []string {
	return append(os.Environ(), "PGHOST="+host, "PGPORT="+port, "PGUSER="+compatUser, "PGPASSWORD="+compatPassword,
		"PGDATABASE=retina", "PGSSLMODE=disable", "PGCONNECT_TIMEOUT=10")
}

// runClient runs a client program with a time limit and returns its output.
func runClient(t *testing.T, env []string, name string, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = env
	cmd.Dir = filepath.Join("testdata", "clients")
	out, err := cmd.Output()
	if err != nil {
		stderr := ""
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("%s %s: %v\n%s%s", name, strings.Join(args, " "), err, out, stderr)
	}
	return out
}

// need finds a program the suite runs, or fails with how to install it:
// a missing client is a failure, not a skip.
func need(t *testing.T, path, install string) string {
	t.Helper()
	if filepath.IsAbs(path) {
		if _, err := os.Stat(path); err == nil {
			return path
		}
	} else if p, err := exec.LookPath(path); err == nil {
		return p
	}
	t.Fatalf("%s not found: %s (.ci/install does)", path, install)
	return ""
}

func TestClientPsql(t *testing.T) {
	host, port := compatServer(t)
	bin, err := pgtest.Find()
	if err != nil {
		t.Fatal(err)
	}
	psql := filepath.Join(bin, "psql")
	if _, err := os.Stat(psql); err != nil {
		psql = need(t, "psql", "install Debian's postgresql-client")
	}
	csv := filepath.Join(t.TempDir(), "out.csv")
	var out []byte
	for _, cmds := range [][]string{{`\dt`}, {`\d account`}, {`\dn`}, {`\l`}, {`\di`},
		{`\x`, "SELECT count(*), sum(balance), max(owner) FROM account"},
		{`\copy (SELECT id, owner, balance FROM account WHERE id < 5 ORDER BY id) to '` + csv + `' csv header`},
	} {
		args := []string{"-X", "-v", "ON_ERROR_STOP=1"}
		for _, c := range cmds {
			out = append(out, "> "+strings.ReplaceAll(c, csv, "FILE")+"\n"...)
			args = append(args, "-c", c)
		}
		out = append(out, runClient(t, pgEnv(host, port), psql, args...)...)
	}
	file, err := os.ReadFile(csv)
	if err != nil {
		t.Fatal(err)
	}
	out = append(out, "> FILE\n"...)
	checkOutput(t, "psql", append(out, file...))
}

func TestClientPsycopg2(t *testing.T) {
	host, port := compatServer(t)
	python := need(t, "/usr/bin/python3", "install Debian's python3-psycopg2")
	checkOutput(t, "psycopg2", runClient(t, pgEnv(host, port), python, "compat.py"))
}

func TestClientJDBC(t *testing.T) {
	host, port := compatServer(t)
	java := need(t, "java", "install Debian's default-jdk-headless")
	jar := need(t, "/usr/share/java/postgresql.jar", "install Debian's libpostgresql-jdbc-java")
	url := fmt.Sprintf("jdbc:postgresql://%s:%s/retina?sslmode=disable&connectTimeout=10", host, port)
	checkOutput(t, "jdbc", runClient(t, os.Environ(), java, "-cp", jar, "Compat.java", url, compatUser, compatPassword))
}

func TestClientNodePostgres(t *testing.T) {
	host, port := compatServer(t)
	node := need(t, "node", "install Debian's nodejs and npm")
	need(t, filepath.Join(mustAbs(t, "testdata/clients/node_modules/pg"), "package.json"), "run npm ci in internal/pgwire/testdata/clients")
	checkOutput(t, "node-postgres", runClient(t, pgEnv(host, port), node, "compat.js"))
}

func mustAbs(t *testing.T, p string) string {
	a, err := filepath.Abs(p)
	if err != nil {
		t.Fatal(err)
	}
	return a
}
