package pgwire

import (
	"context"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
)

// FuzzStartupAndLogin feeds arbitrary bytes to a connection as a client
// would send them before it is logged in: the startup packet, an SSL or
// GSS request, a cancel request, and the SCRAM exchange of a server with a
// password. Whatever arrives, the server answers or hangs up without a
// panic, and ends the connection once the client has gone.
func FuzzStartupAndLogin(f *testing.F) {
	users := Users{}
	if err := users.AddUser("alice", "secret"); err != nil {
		f.Fatal(err)
	}
	s := &Server{opts: Options{Users: users}, log: slog.New(slog.DiscardHandler), conns: map[uint32]*clientConn{}, saltKey: make([]byte, 32)}
	encode := func(msgs ...pgproto3.FrontendMessage) []byte {
		var out []byte
		for _, m := range msgs {
			var err error
			if out, err = m.Encode(out); err != nil {
				f.Fatal(err)
			}
		}
		return out
	}
	startup := &pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersionNumber, Parameters: map[string]string{"user": "alice", "database": "retina"}}
	f.Add(encode(startup))
	f.Add(encode(&pgproto3.SSLRequest{}, startup))
	f.Add(encode(&pgproto3.GSSEncRequest{}, startup))
	f.Add(encode(&pgproto3.CancelRequest{ProcessID: 1, SecretKey: []byte{1, 2, 3, 4}}))
	f.Add(encode(startup, &pgproto3.SASLInitialResponse{AuthMechanism: "SCRAM-SHA-256", Data: []byte("n,,n=alice,r=abcdefghijklmnop")}))
	f.Add(encode(startup, &pgproto3.SASLInitialResponse{AuthMechanism: "SCRAM-SHA-256", Data: []byte("n,,n=alice,r=abc")},
		&pgproto3.SASLResponse{Data: []byte("c=biws,r=abc,p=AAAA")}))
	f.Add(encode(startup, &pgproto3.PasswordMessage{Password: "secret"}))
	f.Add([]byte{0, 0, 0, 8, 4, 210, 22, 47})
	f.Fuzz(func(t *testing.T, data []byte) {
		server, client := net.Pipe()
		done := make(chan struct{})
		go func() {
			defer close(done)
			s.handle(context.Background(), server)
		}()
		go io.Copy(io.Discard, client)
		client.Write(data) // fails once the server has hung up
		client.Close()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("the connection was not ended 10 s after the client closed it")
		}
	})
}
