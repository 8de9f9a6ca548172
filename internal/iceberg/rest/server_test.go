package rest_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	ice "github.com/apache/iceberg-go"
	"github.com/apache/iceberg-go/catalog"
	icerest "github.com/apache/iceberg-go/catalog/rest"
	"github.com/apache/iceberg-go/table"
	"github.com/google/uuid"

	"github.com/retinadb/retina/internal/iceberg"
	"github.com/retinadb/retina/internal/iceberg/rest"
	"github.com/retinadb/retina/internal/pgwire"
)

// tables is a catalog of fixed tables.
type tables []iceberg.CatalogTable

func (t tables) Tables() []iceberg.CatalogTable { return t }

// metadata is a valid table metadata file of one long column.
func metadata(t *testing.T, location string) []byte {
	t.Helper()
	b, err := table.NewMetadataBuilder(2)
	if err != nil {
		t.Fatal(err)
	}
	schema := ice.NewSchema(0, ice.NestedField{ID: 1, Name: "id", Type: ice.PrimitiveTypes.Int64, Required: true})
	for _, err := range []error{b.SetUUID(uuid.New()), b.SetLoc(location), b.AddSchema(schema), b.SetCurrentSchemaID(-1),
		b.AddPartitionSpec(ice.UnpartitionedSpec, true), b.SetDefaultSpecID(-1), b.AddSortOrder(&table.UnsortedSortOrder), b.SetDefaultSortOrderID(-1)} {
		if err != nil {
			t.Fatal(err)
		}
	}
	md, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	data, err := json.Marshal(md)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func fixture(t *testing.T) tables {
	return tables{
		{Namespace: "public", Name: "account", MetadataLocation: "file:///lake/iceberg/public/account/metadata/v1.metadata.json", Metadata: metadata(t, "file:///lake/iceberg/public/account")},
		{Namespace: "sales", Name: "orders", MetadataLocation: "file:///lake/iceberg/sales/orders/metadata/v3.metadata.json", Metadata: metadata(t, "file:///lake/iceberg/sales/orders")},
	}
}

func get(t *testing.T, method, u string, header http.Header) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(method, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var out map[string]any
	if len(body) > 0 {
		if err := json.Unmarshal(body, &out); err != nil {
			t.Fatalf("%s %s: body %q is not JSON: %v", method, u, body, err)
		}
	}
	return resp.StatusCode, out
}

// TestReadRoutes: what readers call answers as the REST specification
// says, missing objects are 404 with the specification's error types, and
// every write is 406 UnsupportedOperationException.
func TestReadRoutes(t *testing.T) {
	srv := httptest.NewServer(rest.New(fixture(t), rest.Options{NoUsers: true, Defaults: map[string]string{"s3.endpoint": "http://127.0.0.1:8333"}}))
	defer srv.Close()
	code, cfg := get(t, "GET", srv.URL+"/v1/config", nil)
	if code != 200 || cfg["defaults"].(map[string]any)["s3.endpoint"] != "http://127.0.0.1:8333" || len(cfg["endpoints"].([]any)) == 0 {
		t.Fatalf("config: %d %v", code, cfg)
	}
	code, ns := get(t, "GET", srv.URL+"/v1/namespaces", nil)
	if got, _ := json.Marshal(ns["namespaces"]); code != 200 || string(got) != `[["public"],["sales"]]` {
		t.Fatalf("namespaces: %d %s", code, got)
	}
	code, list := get(t, "GET", srv.URL+"/v1/namespaces/sales/tables", nil)
	if got, _ := json.Marshal(list["identifiers"]); code != 200 || string(got) != `[{"name":"orders","namespace":["sales"]}]` {
		t.Fatalf("list tables: %d %s", code, got)
	}
	code, load := get(t, "GET", srv.URL+"/v1/namespaces/public/tables/account", nil)
	if code != 200 || load["metadata-location"] != "file:///lake/iceberg/public/account/metadata/v1.metadata.json" || load["metadata"] == nil {
		t.Fatalf("load table: %d %v", code, load)
	}
	for _, c := range []struct {
		method, path string
		code         int
		typ          string
	}{
		{"HEAD", "/v1/namespaces/public", 204, ""},
		{"HEAD", "/v1/namespaces/public/tables/account", 204, ""},
		{"GET", "/v1/namespaces/nope", 404, "NoSuchNamespaceException"},
		{"GET", "/v1/namespaces/nope/tables", 404, "NoSuchNamespaceException"},
		{"GET", "/v1/namespaces/public/tables/nope", 404, "NoSuchTableException"},
		{"POST", "/v1/namespaces", 406, "UnsupportedOperationException"},
		{"POST", "/v1/namespaces/public/tables", 406, "UnsupportedOperationException"},
		{"POST", "/v1/namespaces/public/tables/account", 406, "UnsupportedOperationException"},
		{"DELETE", "/v1/namespaces/public/tables/account", 406, "UnsupportedOperationException"},
		{"POST", "/v1/tables/rename", 406, "UnsupportedOperationException"},
		{"POST", "/v1/transactions/commit", 406, "UnsupportedOperationException"},
	} {
		code, body := get(t, c.method, srv.URL+c.path, nil)
		if code != c.code {
			t.Errorf("%s %s: %d, want %d (%v)", c.method, c.path, code, c.code, body)
			continue
		}
		if c.typ != "" {
			e, _ := body["error"].(map[string]any)
			if e == nil || e["type"] != c.typ || int(e["code"].(float64)) != c.code {
				t.Errorf("%s %s: error %v, want type %s", c.method, c.path, body, c.typ)
			}
		}
	}
}

// TestIcebergGoWithCredential: with users, iceberg-go authenticates with
// credential=user:password (OAuth2 client credentials) and then loads
// tables; a wrong password gets no token and no table.
func TestIcebergGoWithCredential(t *testing.T) {
	users := pgwire.Users{}
	if err := users.AddUser("alice", "s3cret"); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(rest.New(fixture(t), rest.Options{Users: users}))
	defer srv.Close()
	ctx := context.Background()

	if code, _ := get(t, "GET", srv.URL+"/v1/namespaces", nil); code != 401 {
		t.Fatalf("namespaces without a token: %d, want 401", code)
	}
	cat, err := icerest.NewCatalog(ctx, "retina", srv.URL, icerest.WithCredential("alice:s3cret"))
	if err != nil {
		t.Fatal(err)
	}
	tbl, err := cat.LoadTable(ctx, table.Identifier{"sales", "orders"})
	if err != nil {
		t.Fatal(err)
	}
	if tbl.Location() != "file:///lake/iceberg/sales/orders" {
		t.Fatalf("location %s", tbl.Location())
	}
	if _, err := cat.LoadTable(ctx, table.Identifier{"sales", "missing"}); !errors.Is(err, catalog.ErrNoSuchTable) {
		t.Fatalf("missing table: %v, want ErrNoSuchTable", err)
	}
	if _, err := icerest.NewCatalog(ctx, "retina", srv.URL, icerest.WithCredential("alice:wrong")); err == nil {
		t.Fatal("a wrong password got a catalog")
	}
	resp, err := http.PostForm(srv.URL+"/v1/oauth/tokens", url.Values{"grant_type": {"password"}})
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 400 || !strings.Contains(string(body), "unsupported_grant_type") {
		t.Fatalf("password grant: %d %s", resp.StatusCode, body)
	}
}
