// Package rest serves Retina's published Iceberg tables over the Iceberg
// REST catalog protocol (the Apache Iceberg REST OpenAPI specification),
// the part readers call: the catalog's configuration, namespaces, and
// listing and loading tables. Every write (creating, committing to,
// renaming or dropping a table or namespace) is refused with the
// specification's 406 UnsupportedOperationException: Retina alone writes
// these tables.
//
// Authentication follows the SQL endpoint's: with no users configured the
// catalog is open (as it is on loopback by default); with users, a reader
// gets a bearer token from /v1/oauth/tokens with the OAuth2
// client-credentials grant (client id = user, client secret = password),
// which is what Iceberg clients do when given credential=user:password.
package rest

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/retinadb/retina/internal/iceberg"
)

// Catalog is what the server serves: the published tables.
type Catalog interface {
	Tables() []iceberg.CatalogTable
}

// Authenticator checks a user's password.
type Authenticator interface {
	Verify(user, password string) bool
}

// Options configure the handler.
type Options struct {
	// Users, when set and not empty, must authenticate (see the package
	// comment); nil or empty leaves the catalog open.
	Users Authenticator
	// NoUsers says there are no users (the catalog is open).
	NoUsers bool
	// Defaults are configuration the catalog hands readers (the lake's S3
	// endpoint and region, say).
	Defaults map[string]string
	Logger   *slog.Logger
}

// tokenTTL is how long a bearer token is good for.
const tokenTTL = time.Hour

// Handler serves the catalog.
type Handler struct {
	cat  Catalog
	opts Options
	mux  *http.ServeMux

	mu     sync.Mutex
	tokens map[string]tokenInfo
}

type tokenInfo struct {
	user    string
	expires time.Time
}

// endpoints are the routes the catalog answers, as /v1/config advertises
// them.
var endpoints = []string{
	"GET /v1/{prefix}/namespaces",
	"GET /v1/{prefix}/namespaces/{namespace}",
	"HEAD /v1/{prefix}/namespaces/{namespace}",
	"GET /v1/{prefix}/namespaces/{namespace}/tables",
	"GET /v1/{prefix}/namespaces/{namespace}/tables/{table}",
	"HEAD /v1/{prefix}/namespaces/{namespace}/tables/{table}",
}

// New makes a handler.
func New(cat Catalog, opts Options) *Handler {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	h := &Handler{cat: cat, opts: opts, mux: http.NewServeMux(), tokens: map[string]tokenInfo{}}
	h.mux.HandleFunc("GET /v1/config", h.config)
	h.mux.HandleFunc("POST /v1/oauth/tokens", h.token)
	h.mux.HandleFunc("GET /v1/namespaces", h.authed(h.namespaces))
	h.mux.HandleFunc("GET /v1/namespaces/{ns}", h.authed(h.namespace))
	h.mux.HandleFunc("HEAD /v1/namespaces/{ns}", h.authed(h.namespace))
	h.mux.HandleFunc("GET /v1/namespaces/{ns}/tables", h.authed(h.listTables))
	h.mux.HandleFunc("GET /v1/namespaces/{ns}/tables/{table}", h.authed(h.loadTable))
	h.mux.HandleFunc("HEAD /v1/namespaces/{ns}/tables/{table}", h.authed(h.loadTable))
	h.mux.HandleFunc("/v1/", h.authed(h.refused))
	h.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fail(w, http.StatusNotFound, "NotFoundException", "no such route: the Iceberg REST catalog is under /v1/")
	})
	return h
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.mux.ServeHTTP(w, r) }

func (h *Handler) open() bool { return h.opts.NoUsers || h.opts.Users == nil }

// errorResponse is the specification's IcebergErrorResponse.
type errorResponse struct {
	Error errorModel `json:"error"`
}

type errorModel struct {
	Message string `json:"message"`
	Type    string `json:"type"`
	Code    int    `json:"code"`
}

func fail(w http.ResponseWriter, code int, typ, msg string) {
	reply(w, code, errorResponse{errorModel{Message: msg, Type: typ, Code: code}})
}

func reply(w http.ResponseWriter, code int, body any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(body)
}

// config is GET /v1/config: no prefix, the defaults, the endpoints.
func (h *Handler) config(w http.ResponseWriter, r *http.Request) {
	defaults := map[string]string{}
	for k, v := range h.opts.Defaults {
		defaults[k] = v
	}
	reply(w, http.StatusOK, map[string]any{"defaults": defaults, "overrides": map[string]string{}, "endpoints": endpoints})
}

// token is POST /v1/oauth/tokens with the client-credentials grant.
func (h *Handler) token(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		oauthFail(w, "invalid_request", "the body is not a form")
		return
	}
	if g := r.PostForm.Get("grant_type"); g != "client_credentials" {
		oauthFail(w, "unsupported_grant_type", "grant_type "+strconv.Quote(g)+": only client_credentials is supported")
		return
	}
	user, pw := r.PostForm.Get("client_id"), r.PostForm.Get("client_secret")
	if u, p, ok := r.BasicAuth(); ok {
		user, pw = u, p
	}
	if !h.open() && !h.opts.Users.Verify(user, pw) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		json.NewEncoder(w).Encode(map[string]string{"error": "invalid_client", "error_description": "unknown user or wrong password"})
		return
	}
	buf := make([]byte, 32)
	rand.Read(buf)
	tok := base64.RawURLEncoding.EncodeToString(buf)
	h.mu.Lock()
	now := time.Now()
	for k, t := range h.tokens {
		if now.After(t.expires) {
			delete(h.tokens, k)
		}
	}
	h.tokens[tok] = tokenInfo{user: user, expires: now.Add(tokenTTL)}
	h.mu.Unlock()
	reply(w, http.StatusOK, map[string]any{"access_token": tok, "token_type": "bearer", "expires_in": int(tokenTTL.Seconds()),
		"issued_token_type": "urn:ietf:params:oauth:token-type:access_token"})
}

func oauthFail(w http.ResponseWriter, code, desc string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusBadRequest)
	json.NewEncoder(w).Encode(map[string]string{"error": code, "error_description": desc})
}

// authed checks the bearer token when the catalog has users.
func (h *Handler) authed(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !h.open() {
			tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
			h.mu.Lock()
			t, known := h.tokens[tok]
			h.mu.Unlock()
			if !ok || !known || time.Now().After(t.expires) {
				fail(w, http.StatusUnauthorized, "NotAuthorizedException", "a bearer token from /v1/oauth/tokens is required (credential=user:password)")
				return
			}
		}
		next(w, r)
	}
}

// namespaceOf reads a namespace path parameter: one level (Retina's
// schemas); levels are separated by the unit separator 0x1F.
func namespaceOf(r *http.Request) string { return r.PathValue("ns") }

func (h *Handler) namespaces(w http.ResponseWriter, r *http.Request) {
	seen := map[string]bool{}
	var out [][]string
	parent := r.URL.Query().Get("parent")
	for _, t := range h.cat.Tables() {
		if parent != "" {
			if t.Namespace == parent {
				seen[parent] = true
			}
			continue
		}
		if !seen[t.Namespace] {
			seen[t.Namespace] = true
			out = append(out, []string{t.Namespace})
		}
	}
	if parent != "" && !seen[parent] {
		fail(w, http.StatusNotFound, "NoSuchNamespaceException", "namespace "+strconv.Quote(parent)+" does not exist")
		return
	}
	if out == nil {
		out = [][]string{}
	}
	reply(w, http.StatusOK, map[string]any{"namespaces": out})
}

func (h *Handler) namespace(w http.ResponseWriter, r *http.Request) {
	ns := namespaceOf(r)
	for _, t := range h.cat.Tables() {
		if t.Namespace == ns {
			if r.Method == http.MethodHead {
				w.WriteHeader(http.StatusNoContent)
				return
			}
			reply(w, http.StatusOK, map[string]any{"namespace": []string{ns}, "properties": map[string]string{}})
			return
		}
	}
	fail(w, http.StatusNotFound, "NoSuchNamespaceException", "namespace "+strconv.Quote(ns)+" does not exist")
}

type identifier struct {
	Namespace []string `json:"namespace"`
	Name      string   `json:"name"`
}

func (h *Handler) listTables(w http.ResponseWriter, r *http.Request) {
	ns := namespaceOf(r)
	ids := []identifier{}
	for _, t := range h.cat.Tables() {
		if t.Namespace == ns {
			ids = append(ids, identifier{[]string{ns}, t.Name})
		}
	}
	if len(ids) == 0 {
		fail(w, http.StatusNotFound, "NoSuchNamespaceException", "namespace "+strconv.Quote(ns)+" does not exist")
		return
	}
	reply(w, http.StatusOK, map[string]any{"identifiers": ids})
}

func (h *Handler) loadTable(w http.ResponseWriter, r *http.Request) {
	ns, name := namespaceOf(r), r.PathValue("table")
	for _, t := range h.cat.Tables() {
		if t.Namespace != ns || t.Name != name {
			continue
		}
		if r.Method == http.MethodHead {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		reply(w, http.StatusOK, map[string]any{"metadata-location": t.MetadataLocation, "metadata": json.RawMessage(t.Metadata), "config": map[string]string{}})
		return
	}
	fail(w, http.StatusNotFound, "NoSuchTableException", "table "+strconv.Quote(ns+"."+name)+" does not exist")
}

// refused answers every other route under /v1/: the writes.
func (h *Handler) refused(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		fail(w, http.StatusNotFound, "NotFoundException", r.Method+" "+r.URL.Path+": no such route in Retina's Iceberg catalog")
		return
	}
	fail(w, http.StatusNotAcceptable, "UnsupportedOperationException",
		r.Method+" "+r.URL.Path+": Retina's Iceberg catalog is read-only; Retina alone writes these tables")
}
