package hybench

import (
	"fmt"

	"github.com/retinadb/retina/internal/catalog"
	"github.com/retinadb/retina/internal/types"
)

// Schema is t as a catalog schema.
func (t Table) Schema() (catalog.Schema, error) {
	sc := catalog.Schema{PrimaryKey: []string{t.Key}}
	for _, c := range t.Columns {
		ty, err := types.Parse(c.Type)
		if err != nil {
			return sc, fmt.Errorf("hybench: %s.%s: %w", t.Name, c.Name, err)
		}
		sc.Columns = append(sc.Columns, catalog.Column{Name: c.Name, Type: ty})
	}
	return sc, nil
}

// FreshnessSQL reads the newest commit time a snapshot includes (every
// change transaction writes an account row first). Freshness is the
// query's start time minus it.
const FreshnessSQL = `SELECT epoch_us(greatest((SELECT max(fresh_ts) FROM savingAccount), (SELECT max(fresh_ts) FROM checkingAccount)))`

// BalanceSQL sums both account tables, in cents, in one snapshot: it must
// equal Generator.TotalBalance, whatever the stream has done.
const BalanceSQL = `SELECT CAST(((SELECT sum(balance) FROM savingAccount) + (SELECT sum(balance) FROM checkingAccount)) * 100 AS BIGINT)`

// LoanSQL is accepted applications minus loans: always 0, as approving
// an application and lending are one transaction.
const LoanSQL = `SELECT (SELECT count(*) FROM loanapps WHERE status = 'accept') - (SELECT count(*) FROM loantrans)`

// Query is one named analytical query.
type Query struct {
	Name, SQL string
}

// AnalyticalQueries are HyBench-like AP queries: scans, joins and
// aggregations over the movement history and the account tables.
func AnalyticalQueries() []Query {
	return []Query{
		{"top_senders", `SELECT sourceID, count(*) AS n, sum(amount) AS total FROM transfer GROUP BY sourceID ORDER BY total DESC, sourceID LIMIT 10`},
		{"province_wealth", `SELECT c.province, count(*) AS customers, sum(s.balance + k.balance) AS wealth
			FROM customer c JOIN savingAccount s ON s.accountID = c.custID JOIN checkingAccount k ON k.accountID = c.custID
			GROUP BY c.province ORDER BY wealth DESC`},
		{"company_income", `SELECT co.category, count(*) AS payments, sum(ch.amount) AS income
			FROM checking ch JOIN company co ON ch.targetID = co.companyID + (SELECT max(custID) FROM customer)
			GROUP BY co.category ORDER BY income DESC`},
		{"loan_book", `SELECT la.status, la.duration, count(*) AS apps, sum(la.amount) AS asked, sum(lt.amount) AS lent
			FROM loanapps la LEFT JOIN loantrans lt ON lt.appID = la.id GROUP BY la.status, la.duration ORDER BY 1, 2`},
		{"large_transfers", `SELECT type, count(*) AS n, avg(amount) AS mean, max(amount) AS largest
			FROM transfer WHERE amount > 10000 GROUP BY type ORDER BY type`},
		{"blocked_exposure", `SELECT c.isblocked, count(*) AS customers, sum(c.loan_balance) AS loans, sum(s.balance) AS savings
			FROM customer c JOIN savingAccount s ON s.userID = c.custID WHERE c.age BETWEEN 30 AND 60 GROUP BY c.isblocked ORDER BY 1`},
	}
}
