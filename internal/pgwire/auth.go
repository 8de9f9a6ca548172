package pgwire

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/xdg-go/scram"
)

// scramIterations is PostgreSQL's default (scram_iterations) for the
// verifiers made here from plain passwords.
const scramIterations = 4096

// Users are the accounts that may log in, each with its SCRAM-SHA-256
// verifier. No users means no password is asked (trust), as for a local
// development server.
type Users map[string]scram.StoredCredentials

// AddUser adds an account. secret is a password, or a verifier as
// PostgreSQL stores it (SCRAM-SHA-256$iterations:salt$StoredKey:ServerKey,
// e.g. from pg_authid), so that no plain password need be written down.
func (u Users) AddUser(name, secret string) error {
	if name == "" {
		return fmt.Errorf("pgwire: a user needs a name")
	}
	if _, dup := u[name]; dup {
		return fmt.Errorf("pgwire: user %q is declared twice", name)
	}
	if strings.HasPrefix(secret, "SCRAM-SHA-256$") {
		c, err := parseVerifier(secret)
		if err != nil {
			return fmt.Errorf("pgwire: user %q: %w", name, err)
		}
		u[name] = c
		return nil
	}
	if secret == "" {
		return fmt.Errorf("pgwire: user %q has an empty password", name)
	}
	client, err := scram.SHA256.NewClient(name, secret, "")
	if err != nil {
		return fmt.Errorf("pgwire: user %q: the password cannot be used (%w)", name, err)
	}
	salt := make([]byte, 16)
	rand.Read(salt)
	c, err := client.GetStoredCredentialsWithError(scram.KeyFactors{Salt: string(salt), Iters: scramIterations})
	if err != nil {
		return fmt.Errorf("pgwire: user %q: %w", name, err)
	}
	u[name] = c
	return nil
}

// Verify says password is the user's, for endpoints that take a password
// in the clear over TLS (the Iceberg REST catalog's token requests): it
// derives the user's keys with the stored salt and compares them in
// constant time.
func (u Users) Verify(name, password string) bool {
	stored, ok := u[name]
	if !ok || password == "" {
		return false
	}
	client, err := scram.SHA256.NewClient(name, password, "")
	if err != nil {
		return false
	}
	got, err := client.GetStoredCredentialsWithError(stored.KeyFactors)
	return err == nil && subtle.ConstantTimeCompare(got.StoredKey, stored.StoredKey) == 1
}

// parseVerifier reads SCRAM-SHA-256$iterations:salt$StoredKey:ServerKey
// (base64 fields), PostgreSQL's stored form of a password.
func parseVerifier(v string) (scram.StoredCredentials, error) {
	bad := func(why string) (scram.StoredCredentials, error) {
		return scram.StoredCredentials{}, fmt.Errorf("SCRAM verifier %s; want SCRAM-SHA-256$iterations:salt$StoredKey:ServerKey", why)
	}
	parts := strings.Split(v, "$")
	if len(parts) != 3 {
		return bad("has the wrong number of $ fields")
	}
	iterText, saltText, ok := strings.Cut(parts[1], ":")
	if !ok {
		return bad("lacks iterations:salt")
	}
	storedText, serverText, ok := strings.Cut(parts[2], ":")
	if !ok {
		return bad("lacks StoredKey:ServerKey")
	}
	iters, err := strconv.Atoi(iterText)
	if err != nil || iters < 1 {
		return bad("has a bad iteration count")
	}
	salt, err1 := base64.StdEncoding.DecodeString(saltText)
	stored, err2 := base64.StdEncoding.DecodeString(storedText)
	server, err3 := base64.StdEncoding.DecodeString(serverText)
	if err := errors.Join(err1, err2, err3); err != nil || len(stored) != 32 || len(server) != 32 {
		return bad("has a field that is not base64 or keys that are not 32 bytes")
	}
	return scram.StoredCredentials{KeyFactors: scram.KeyFactors{Salt: string(salt), Iters: iters}, StoredKey: stored, ServerKey: server}, nil
}

// errAuth is a failed login; clients see SQLSTATE 28P01, and nothing
// says whether the user or the password was wrong.
var errAuth = errors.New("password authentication failed")

// errTLSRequired refuses a client that did not start TLS.
var errTLSRequired = errors.New("this server accepts TLS connections only (use sslmode=require or stronger)")

// authenticate runs SCRAM-SHA-256 (with channel binding over TLS when the
// client offers it) for the startup message's user.
func (c *clientConn) authenticate(user string) error {
	users := c.srv.opts.Users
	if len(users) == 0 {
		return nil
	}
	creds, known := users[user]
	if !known {
		// Run the exchange anyway against a verifier no password matches,
		// with a salt as stable as a real user's, so the replies do not say
		// which user names exist.
		mac := hmac.New(sha256.New, c.srv.saltKey)
		mac.Write([]byte(user))
		salt := mac.Sum(nil)[:16]
		creds = scram.StoredCredentials{KeyFactors: scram.KeyFactors{Salt: string(salt), Iters: scramIterations}, StoredKey: make([]byte, 32), ServerKey: make([]byte, 32)}
	}
	srv, err := scram.SHA256.NewServer(func(string) (scram.StoredCredentials, error) { return creds, nil })
	if err != nil {
		return err
	}
	mechs := []string{"SCRAM-SHA-256"}
	conv := srv.NewConversation()
	if tc, ok := c.net.(*tls.Conn); ok {
		state := tc.ConnectionState()
		if cb, err := scram.NewTLSServerEndpointBinding(&state); err == nil {
			mechs = []string{"SCRAM-SHA-256-PLUS", "SCRAM-SHA-256"}
			conv = srv.NewConversationWithChannelBinding(cb)
		}
	}
	c.be.Send(&pgproto3.AuthenticationSASL{AuthMechanisms: mechs})
	if err := c.be.Flush(); err != nil {
		return err
	}
	c.be.SetAuthType(pgproto3.AuthTypeSASL)
	msg, err := c.be.Receive()
	if err != nil {
		return err
	}
	first, ok := msg.(*pgproto3.SASLInitialResponse)
	if !ok {
		return fmt.Errorf("%w: expected a SASL initial response, got %T", errProtocol, msg)
	}
	if !slices.Contains(mechs, first.AuthMechanism) {
		return fmt.Errorf("%w: SASL mechanism %q was not offered", errProtocol, first.AuthMechanism)
	}
	out, err := conv.Step(string(first.Data))
	if err != nil {
		return fmt.Errorf("%w for user %q", errAuth, user)
	}
	c.be.Send(&pgproto3.AuthenticationSASLContinue{Data: []byte(out)})
	if err := c.be.Flush(); err != nil {
		return err
	}
	c.be.SetAuthType(pgproto3.AuthTypeSASLContinue)
	msg, err = c.be.Receive()
	if err != nil {
		return err
	}
	final, ok := msg.(*pgproto3.SASLResponse)
	if !ok {
		return fmt.Errorf("%w: expected a SASL response, got %T", errProtocol, msg)
	}
	out, err = conv.Step(string(final.Data))
	if err != nil || !conv.Valid() || !known {
		return fmt.Errorf("%w for user %q", errAuth, user)
	}
	c.be.Send(&pgproto3.AuthenticationSASLFinal{Data: []byte(out)})
	return nil
}

// isLoopback reports an address only this machine can reach.
func isLoopback(addr net.Addr) bool {
	tcp, ok := addr.(*net.TCPAddr)
	return ok && tcp.IP.IsLoopback()
}
