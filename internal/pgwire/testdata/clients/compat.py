# The client-compatibility checks through psycopg2 (libpq underneath).
# Connection settings come from the PG* environment variables.
import datetime
import decimal

import psycopg2

conn = psycopg2.connect("")
cur = conn.cursor()

cur.execute("SELECT count(*), sum(balance) FROM account")
print("names:", ",".join(d.name for d in cur.description))
count, total = cur.fetchone()
print("aggregate:", count, total)

cur.execute("SELECT id, owner, balance FROM account WHERE id = %s", (3,))
row = cur.fetchone()
print("by id:", row[0], "NULL" if row[1] is None else row[1], row[2])

cur.execute("SELECT count(*) FROM account WHERE balance > %s", (decimal.Decimal("600.25"),))
print("decimal parameter:", cur.fetchone()[0])

cur.execute("SELECT count(*) FROM orders WHERE placed < %s", (datetime.datetime(2024, 1, 5),))
print("timestamp parameter:", cur.fetchone()[0])

# A named (server-side) cursor: DECLARE, then FETCH in batches.
named = conn.cursor("compat_cursor")
named.itersize = 3
named.execute("SELECT oid, amount FROM orders ORDER BY oid")
rows = [r for r in named]
print("named cursor:", len(rows), "rows, last", rows[-1][0], rows[-1][1], type(rows[-1][1]).__name__)
named.close()
conn.rollback()
conn.close()
