package bench

import (
	"database/sql"
	"testing"
)

// TestParseGoTPC reads go-tpc's summary: tpmC, and failed transactions as
// a share of all, from the _ERR lines.
func TestParseGoTPC(t *testing.T) {
	out := `[Current] NEW_ORDER - Takes(s): 10.0, Count: 440, TPM: 2649.8, Sum(ms): 4969.1, Avg(ms): 11.3
execute run failed, err exec UPDATE warehouse ... Error 1213: write conflict
Finished
[Summary] DELIVERY - Takes(s): 19.9, Count: 90, TPM: 271.3, Sum(ms): 2525.4, Avg(ms): 28.1
[Summary] NEW_ORDER - Takes(s): 20.0, Count: 1262, TPM: 3793.2, Sum(ms): 10515.6, Avg(ms): 8.3
[Summary] NEW_ORDER_ERR - Takes(s): 20.0, Count: 1, TPM: 3.0, Sum(ms): 1.5, Avg(ms): 1.3
[Summary] ORDER_STATUS - Takes(s): 20.0, Count: 109, TPM: 327.4, Sum(ms): 322.5, Avg(ms): 3.0
[Summary] PAYMENT - Takes(s): 20.0, Count: 1193, TPM: 3583.5, Sum(ms): 5100.9, Avg(ms): 4.3
[Summary] PAYMENT_ERR - Takes(s): 20.0, Count: 3, TPM: 9.0, Sum(ms): 7.0, Avg(ms): 2.4
[Summary] STOCK_LEVEL - Takes(s): 19.8, Count: 117, TPM: 354.5, Sum(ms): 776.6, Avg(ms): 6.6
tpmC: 3793.2, efficiency: 29496.3%
`
	tpmC, abort, err := parseGoTPC(out)
	if err != nil {
		t.Fatal(err)
	}
	if tpmC != 3793.2 {
		t.Errorf("tpmC %v, want 3793.2", tpmC)
	}
	// 4 failed of 90+1262+1+109+1193+3+117 = 2775.
	if want := 100 * 4.0 / 2775; abort != want {
		t.Errorf("abort %v%%, want %v%%", abort, want)
	}
	if _, _, err := parseGoTPC("execute run failed, err dial tcp: connection refused\n"); err == nil {
		t.Error("output without a summary was accepted")
	}
	if !checkFailed.MatchString("check warehouse 1 at condition 3.3.2.4 failed sum(o_ol_cnt) mismatch") {
		t.Error("a failed condition is not recognized")
	}
}

// TestSameNumber compares the store's and Retina's renderings of one sum.
func TestSameNumber(t *testing.T) {
	s := func(v string) *string { return &v }
	for _, c := range []struct {
		a    sql.NullString
		b    *string
		same bool
	}{
		{sql.NullString{String: "300000.00", Valid: true}, s("300000"), true},
		{sql.NullString{String: "12.5", Valid: true}, s("12.50"), true},
		{sql.NullString{String: "12.5", Valid: true}, s("12.51"), false},
		{sql.NullString{}, nil, true},
		{sql.NullString{}, s("0"), false},
	} {
		if got := sameNumber(c.a, c.b); got != c.same {
			t.Errorf("sameNumber(%v, %v) = %v", c.a, c.b, got)
		}
	}
}

// TestCombineRounds: medians of tpmC and aborts, the worst freshness,
// every sampled snapshot, and the first round's checks.
func TestCombineRounds(t *testing.T) {
	got := combineRounds([]tpccResult{
		{tpmC: 4000, abortPct: 0.05, freshP50: 1, freshP99: 9, samples: 10, consistent: 10, checked: true},
		{tpmC: 3000, abortPct: 0.01, freshP50: 2, freshP99: 4, samples: 12, consistent: 11},
		{tpmC: 5000, abortPct: 0.02, freshP50: 0, freshP99: 3, samples: 8, consistent: 8},
	})
	want := tpccResult{tpmC: 4000, abortPct: 0.02, freshP50: 2, freshP99: 9, samples: 30, consistent: 29, checked: true}
	if got != want {
		t.Fatalf("three rounds: %+v, want %+v", got, want)
	}
	if got := combineRounds([]tpccResult{{tpmC: 10}, {tpmC: 20}}); got.tpmC != 15 {
		t.Fatalf("median of two rounds %v, want 15", got.tpmC)
	}
}
