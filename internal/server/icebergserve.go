package server

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/retinadb/retina/internal/iceberg/rest"
	"github.com/retinadb/retina/internal/pgwire"
)

// listenIceberg binds the Iceberg REST catalog when one is configured. On
// loopback it is open, as the SQL endpoint is without users; beyond it the
// SQL endpoint's users must authenticate and its TLS certificate serves
// HTTPS.
func (s *Server) listenIceberg(users pgwire.Users, tlsCfg *tls.Config) error {
	if s.cfg.IcebergAddr == "" {
		return nil
	}
	if s.Node.Iceberg == nil {
		return fmt.Errorf("server: iceberg_addr %s: the tables are not published (the lake %s has no addresses other engines can open, or iceberg_interval is 0)", s.cfg.IcebergAddr, s.Node.Lake.URL())
	}
	l, err := net.Listen("tcp", s.cfg.IcebergAddr)
	if err != nil {
		return fmt.Errorf("server: Iceberg REST catalog listen on %s: %w", s.cfg.IcebergAddr, err)
	}
	opts := rest.Options{Defaults: lakeReaderConfig(s.Node.Lake.URL()), Logger: s.log, NoUsers: true}
	if !loopback(l.Addr()) {
		if len(users) > 0 {
			opts.Users, opts.NoUsers = users, false
		} else {
			s.log.Warn("the Iceberg REST catalog listens beyond loopback without users: anyone who reaches it reads every table; configure sql_users", "addr", l.Addr().String())
		}
		if tlsCfg != nil {
			l = tls.NewListener(l, tlsCfg)
			s.iceTLS = true
		}
	}
	s.iceL = l
	s.iceHTTP = &http.Server{Handler: rest.New(s.Node.Iceberg, opts), ReadHeaderTimeout: 10 * time.Second}
	return nil
}

func loopback(a net.Addr) bool {
	tcp, ok := a.(*net.TCPAddr)
	return ok && tcp.IP.IsLoopback()
}

// lakeReaderConfig is what a reader needs to open an S3 lake's files:
// its endpoint, region and addressing style (credentials are the
// reader's own).
func lakeReaderConfig(lakeURL string) map[string]string {
	out := map[string]string{}
	u, err := url.Parse(lakeURL)
	if err != nil || u.Scheme != "s3" {
		return out
	}
	q := u.Query()
	if v := q.Get("endpoint"); v != "" {
		out["s3.endpoint"] = v
	}
	if v := q.Get("region"); v != "" {
		out["s3.region"] = v
	}
	if v := q.Get("use_path_style"); v == "true" || v == "1" {
		out["s3.path-style-access"] = "true"
	}
	return out
}

// IcebergAddr is the bound address of the Iceberg REST catalog ("" when
// not served).
func (s *Server) IcebergAddr() string {
	if s.iceL == nil {
		return ""
	}
	return s.iceL.Addr().String()
}

// IcebergURI is the catalog URI readers are given ("" when not served).
func (s *Server) IcebergURI() string {
	if s.iceL == nil {
		return ""
	}
	scheme := "http"
	if s.iceTLS {
		scheme = "https"
	}
	return scheme + "://" + s.iceL.Addr().String()
}

// registerIcebergMetrics adds the publisher's figures.
func (s *Server) registerIcebergMetrics(reg *prometheus.Registry) {
	p := s.Node.Iceberg
	if p == nil {
		return
	}
	counter := func(name, help string, f func() float64) {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "retina", Name: name, Help: help}, f))
	}
	gauge := func(name, help string, f func() float64) {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "retina", Name: name, Help: help}, f))
	}
	counter("iceberg_publications_total", "Iceberg publications committed (one snapshot of every table each).",
		func() float64 { return float64(p.Stats().Publications) })
	counter("iceberg_publication_failures_total", "Iceberg publications that failed (the previous snapshots stayed current).",
		func() float64 { return float64(p.Stats().Failures) })
	counter("iceberg_published_bytes_total", "Bytes the Iceberg publications wrote (pieces, delete files, manifests and metadata).",
		func() float64 { b := p.Stats().Written; return float64(b.Data + b.Deletes + b.Metadata) })
	gauge("iceberg_publication_lag_seconds", "From the last published checkpoint's seal to its publication becoming current.",
		func() float64 { l := p.Stats().Last; return l.Committed.Sub(l.Sealed).Seconds() })
	gauge("iceberg_publication_duration_seconds", "How long the last publication took.",
		func() float64 { return p.Stats().Last.Duration.Seconds() })
	gauge("iceberg_snapshots_retained", "Snapshots the published tables list, all tables together.",
		func() float64 { return float64(p.Stats().Retained) })
	gauge("iceberg_snapshot_ts", "The Retina timestamp of the current Iceberg snapshots.",
		func() float64 { _, ts := p.Current(); return float64(ts) })
}
