package pgwire_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/xdg-go/scram"

	"github.com/retinadb/retina/internal/pgtest"
	"github.com/retinadb/retina/internal/pgwire"
	"github.com/retinadb/retina/internal/server"
	"github.com/retinadb/retina/internal/server/servertest"
)

// selfSigned makes a certificate for 127.0.0.1 and localhost and writes it
// to dir as cert.pem (also the root clients verify against) and key.pem.
func selfSigned(t *testing.T, dir string) *tls.Config {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "retina test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
	if err := os.WriteFile(filepath.Join(dir, "cert.pem"), certPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "key.pem"), keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{Certificates: []tls.Certificate{pair}}
}

func serveWith(t *testing.T, n *server.Node, opts pgwire.Options) string {
	t.Helper()
	opts.Logger = servertest.Quiet()
	srv, err := pgwire.Listen("127.0.0.1:0", n.Engine, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { srv.Serve(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return srv.Addr()
}

func sqlState(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// verifier forms PostgreSQL's stored password, as pg_authid holds it.
func verifier(t *testing.T, user, password string) string {
	t.Helper()
	c, err := scram.SHA256.NewClient(user, password, "")
	if err != nil {
		t.Fatal(err)
	}
	creds, err := c.GetStoredCredentialsWithError(scram.KeyFactors{Salt: "0123456789abcdef", Iters: 4096})
	if err != nil {
		t.Fatal(err)
	}
	b64 := base64.StdEncoding.EncodeToString
	return fmt.Sprintf("SCRAM-SHA-256$%d:%s$%s:%s", creds.Iters, b64([]byte(creds.Salt)), b64(creds.StoredKey), b64(creds.ServerKey))
}

func TestPasswordsAndTLS(t *testing.T) {
	n := servertest.OpenNode(t)
	servertest.CreateTable(t, n, "account", accountCols(), "id")
	dir := t.TempDir()
	users := pgwire.Users{}
	if err := users.AddUser("alice", "s3cret wörd"); err != nil {
		t.Fatal(err)
	}
	if err := users.AddUser("bob", verifier(t, "bob", "hunter2")); err != nil {
		t.Fatal(err)
	}
	addr := serveWith(t, n, pgwire.Options{Users: users, TLS: selfSigned(t, dir), RequireTLS: true})
	host, port, _ := net.SplitHostPort(addr)
	root := filepath.Join(dir, "cert.pem")
	dsn := func(user, password, sslmode string) string {
		return fmt.Sprintf("host=%s port=%s user=%s password='%s' dbname=retina sslmode=%s sslrootcert=%s connect_timeout=10", host, port, user, password, sslmode, root)
	}
	ctx := context.Background()
	try := func(conn string) error {
		c, err := pgx.Connect(ctx, conn)
		if err != nil {
			return err
		}
		defer c.Close(ctx)
		var user string
		if err := c.QueryRow(ctx, "SHOW session_authorization").Scan(&user); err != nil {
			return err
		}
		var one int32
		return c.QueryRow(ctx, "SELECT 1").Scan(&one)
	}
	for _, mode := range []string{"require", "verify-ca", "verify-full"} {
		if err := try(dsn("alice", "s3cret wörd", mode)); err != nil {
			t.Fatalf("alice with sslmode=%s: %v", mode, err)
		}
	}
	if err := try(dsn("bob", "hunter2", "verify-full")); err != nil {
		t.Fatalf("bob, whose password is configured as a SCRAM verifier: %v", err)
	}
	for _, c := range []struct{ user, password string }{{"alice", "wrong"}, {"mallory", "s3cret wörd"}, {"bob", ""}} {
		err := try(dsn(c.user, c.password, "require"))
		if got := sqlState(err); got != "28P01" {
			t.Fatalf("%s with a bad password: SQLSTATE %q (%v), want 28P01", c.user, got, err)
		}
	}
	if err := try(dsn("alice", "s3cret wörd", "disable")); sqlState(err) != "28000" {
		t.Fatalf("a client without TLS: %v, want SQLSTATE 28000", err)
	}

	// psql, through libpq: verify-full with SCRAM (channel binding where
	// libpq offers it).
	bin, err := pgtest.Find()
	if err != nil {
		t.Fatal(err)
	}
	psql := filepath.Join(bin, "psql")
	if _, err := os.Stat(psql); err != nil {
		if psql, err = exec.LookPath("psql"); err != nil {
			t.Fatal("psql not found: install Debian's postgresql-client (.ci/install does)")
		}
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(cctx, psql, "-X", "-A", "-t", "-c", "SELECT 40 + 2", dsn("alice", "s3cret wörd", "verify-full"))
	cmd.Env = append(os.Environ(), "PGCONNECT_TIMEOUT=10")
	out, err := cmd.CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "42" {
		t.Fatalf("psql with verify-full: %v\n%s", err, out)
	}
	cmd = exec.CommandContext(cctx, psql, "-X", "-A", "-t", "-c", "SELECT 1", dsn("alice", "nope", "require"))
	out, err = cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "password authentication failed") {
		t.Fatalf("psql with a wrong password: %v\n%s", err, out)
	}
}

func TestListenRefusesTLSRequiredWithoutCertificate(t *testing.T) {
	n := servertest.OpenNode(t)
	_, err := pgwire.Listen("127.0.0.1:0", n.Engine, pgwire.Options{RequireTLS: true, Logger: servertest.Quiet()})
	if err == nil || !strings.Contains(err.Error(), "sql_tls_cert") {
		t.Fatalf("got %v", err)
	}
}
