// Package etcdembed runs a single-member etcd server inside the process, on
// 127.0.0.1 random ports, for tests, benchmarks and single-machine
// distributed-mode trials.
package etcdembed

import (
	"context"
	"fmt"
	"net/url"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Server is a running embedded etcd and a client connected to it.
type Server struct {
	etcd   *embed.Etcd
	client *clientv3.Client
}

// Start runs etcd with its data in dir and waits until it serves.
func Start(ctx context.Context, dir string) (*Server, error) {
	cfg := embed.NewConfig()
	cfg.Name = "retina"
	cfg.Dir = dir
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	local := []url.URL{{Scheme: "http", Host: "127.0.0.1:0"}}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = local, local
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = local, local
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("start embedded etcd: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-ctx.Done():
		e.Close()
		return nil, ctx.Err()
	case <-time.After(30 * time.Second):
		e.Close()
		return nil, fmt.Errorf("embedded etcd not ready after 30s")
	}
	client, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{e.Clients[0].Addr().String()},
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		e.Close()
		return nil, fmt.Errorf("etcd client: %w", err)
	}
	return &Server{etcd: e, client: client}, nil
}

// Client is connected to the server; Close closes it.
func (s *Server) Client() *clientv3.Client { return s.client }

// Endpoint is the client URL host:port.
func (s *Server) Endpoint() string { return s.etcd.Clients[0].Addr().String() }

// Close stops the client and the server.
func (s *Server) Close() {
	s.client.Close()
	s.etcd.Close()
}
