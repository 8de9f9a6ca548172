// The client-compatibility checks through node-postgres (npm "pg").
// Connection settings come from the PG* environment variables.
const { Client } = require('pg');

async function main() {
  const c = new Client();
  await c.connect();
  let r = await c.query('SELECT count(*), sum(balance) FROM account');
  console.log('names: ' + r.fields.map((f) => f.name).join(','));
  console.log('aggregate: ' + r.rows[0].count + ' ' + r.rows[0].sum);
  console.log('field types: ' + r.fields.map((f) => f.dataTypeID).join(','));
  r = await c.query('SELECT id, owner, balance FROM account WHERE id = $1', [3]);
  console.log('by id: ' + r.rows[0].id + ' ' + (r.rows[0].owner === null ? 'NULL' : r.rows[0].owner) + ' ' + r.rows[0].balance);
  r = await c.query('SELECT count(*) FROM account WHERE balance > $1', ['600.25']);
  console.log('decimal parameter: ' + r.rows[0].count);
  r = await c.query('SELECT count(*) FROM orders WHERE placed < $1', ['2024-01-05 00:00:00']);
  console.log('timestamp parameter: ' + r.rows[0].count);
  r = await c.query({ text: 'SELECT oid, amount FROM orders ORDER BY oid', rowMode: 'array' });
  console.log('array rows: ' + r.rows.length + ', last ' + r.rows[r.rows.length - 1].join(' '));
  await c.end();
}

main().catch((e) => {
  console.error(e.message);
  process.exit(1);
});
