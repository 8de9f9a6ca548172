// Package hybench generates a HyBench-like banking workload as Debezium
// JSON: the schema, a base dataset as snapshot events, and a stream of
// data-change transactions whose invariants a consistent reader can check.
//
// The tables and their relative sizes follow the HyBench paper (Zhang, Li,
// Lv, VLDB 2024) as we read it; the generator is our own.
package hybench

import "math"

// Column is one column; Type is in the form types.Parse reads.
type Column struct {
	Name, Type string
}

// Table is one table of the workload. Key is its single-column primary key.
type Table struct {
	Name    string
	Columns []Column
	Key     string
}

// Table names.
const (
	Customer        = "customer"
	Company         = "company"
	SavingAccount   = "savingAccount"
	CheckingAccount = "checkingAccount"
	Transfer        = "transfer"
	Checking        = "checking"
	LoanApps        = "loanapps"
	LoanTrans       = "loantrans"
)

const (
	money = "decimal(15,2)"
	ts    = "timestamp"
)

// Tables is the schema. Every table carries fresh_ts: the commit wall time
// of the transaction that wrote the row, which the freshness probe reads.
func Tables() []Table {
	account := func(name string) Table {
		return Table{Name: name, Key: "accountID", Columns: []Column{
			{"accountID", "int64"}, {"userID", "int64"}, {"balance", money}, {"isblocked", "bool"},
			{"ts", ts}, {"fresh_ts", ts},
		}}
	}
	movement := func(name string) Table {
		return Table{Name: name, Key: "id", Columns: []Column{
			{"id", "int64"}, {"sourceID", "int64"}, {"targetID", "int64"}, {"amount", money},
			{"type", "string"}, {"ts", ts}, {"fresh_ts", ts},
		}}
	}
	return []Table{
		{Name: Customer, Key: "custID", Columns: []Column{
			{"custID", "int64"}, {"companyID", "int64"}, {"gender", "string"}, {"name", "string"},
			{"age", "int32"}, {"phone", "string"}, {"province", "string"}, {"city", "string"},
			{"loan_balance", money}, {"saving_credit", "int32"}, {"checking_credit", "int32"},
			{"loan_credit", "int32"}, {"isblocked", "bool"}, {"created_date", "date"},
			{"last_update_ts", ts}, {"fresh_ts", ts},
		}},
		{Name: Company, Key: "companyID", Columns: []Column{
			{"companyID", "int64"}, {"name", "string"}, {"category", "string"}, {"staff_size", "int32"},
			{"loan_balance", money}, {"saving_credit", "int32"}, {"checking_credit", "int32"},
			{"loan_credit", "int32"}, {"isblocked", "bool"}, {"created_date", "date"},
			{"last_update_ts", ts}, {"fresh_ts", ts},
		}},
		account(SavingAccount),
		account(CheckingAccount),
		movement(Transfer),
		movement(Checking),
		{Name: LoanApps, Key: "id", Columns: []Column{
			{"id", "int64"}, {"applicantID", "int64"}, {"amount", money}, {"duration", "int32"},
			{"status", "string"}, {"ts", ts}, {"fresh_ts", ts},
		}},
		{Name: LoanTrans, Key: "id", Columns: []Column{
			{"id", "int64"}, {"applicantID", "int64"}, {"appID", "int64"}, {"amount", money},
			{"status", "string"}, {"ts", ts}, {"duration", "int32"}, {"contract_ts", ts},
			{"delinquency", "int32"}, {"fresh_ts", ts},
		}},
	}
}

// Sizes are the base row counts of a scale factor.
type Sizes struct {
	Customers, Companies, Accounts int // Accounts per account table: one per customer and company
	Transfers, Checkings           int
	LoanApps, LoanTrans            int // LoanTrans ≤ LoanApps: one per accepted application
}

// SizesFor scales HyBench's SF 1 sizes (300K customers, 2K companies, 20
// transfers and 2 checking payments per customer, loan applications for a
// tenth of the customers of which two thirds were accepted).
func SizesFor(sf float64) Sizes {
	n := func(x float64) int { return max(1, int(math.Round(x*sf))) }
	s := Sizes{
		Customers: n(300_000), Companies: n(2_000),
		Transfers: n(6_000_000), Checkings: n(600_000), LoanApps: n(30_000),
	}
	s.Accounts = s.Customers + s.Companies
	s.LoanTrans = s.LoanApps * 2 / 3
	return s
}

// Total is the number of base rows.
func (s Sizes) Total() int {
	return s.Customers + s.Companies + 2*s.Accounts + s.Transfers + s.Checkings + s.LoanApps + s.LoanTrans
}
