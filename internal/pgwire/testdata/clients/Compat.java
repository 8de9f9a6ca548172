// The client-compatibility checks through pgjdbc, the driver DBeaver,
// DataGrip, Metabase and Tableau use. Run as a single source file:
// java -cp postgresql.jar Compat.java URL USER PASSWORD
import java.math.BigDecimal;
import java.sql.*;

public class Compat {
    public static void main(String[] args) throws Exception {
        try (Connection c = DriverManager.getConnection(args[0], args[1], args[2])) {
            try (Statement s = c.createStatement(); ResultSet rs = s.executeQuery("SELECT count(*), sum(balance) FROM account")) {
                ResultSetMetaData md = rs.getMetaData();
                System.out.println("names: " + md.getColumnName(1) + "," + md.getColumnName(2));
                rs.next();
                System.out.println("aggregate: " + rs.getLong(1) + " " + rs.getBigDecimal(2));
            }
            try (PreparedStatement p = c.prepareStatement("SELECT id, owner, balance FROM account WHERE id = ?")) {
                p.setLong(1, 3);
                try (ResultSet rs = p.executeQuery()) {
                    rs.next();
                    String owner = rs.getString(2);
                    System.out.println("by id: " + rs.getLong(1) + " " + (owner == null ? "NULL" : owner) + " " + rs.getBigDecimal(3));
                }
            }
            try (PreparedStatement p = c.prepareStatement("SELECT count(*) FROM account WHERE balance > ?")) {
                p.setBigDecimal(1, new BigDecimal("600.25"));
                try (ResultSet rs = p.executeQuery()) {
                    rs.next();
                    System.out.println("decimal parameter: " + rs.getLong(1));
                }
            }
            try (PreparedStatement p = c.prepareStatement("SELECT count(*) FROM orders WHERE placed < ?")) {
                p.setTimestamp(1, Timestamp.valueOf("2024-01-05 00:00:00"));
                try (ResultSet rs = p.executeQuery()) {
                    rs.next();
                    System.out.println("timestamp parameter: " + rs.getLong(1));
                }
            }
            DatabaseMetaData meta = c.getMetaData();
            StringBuilder tables = new StringBuilder();
            try (ResultSet rs = meta.getTables(null, "public", "%", new String[] {"TABLE"})) {
                while (rs.next()) {
                    tables.append(tables.length() > 0 ? "," : "").append(rs.getString("TABLE_NAME"));
                }
            }
            System.out.println("tables: " + tables);
            try (ResultSet rs = meta.getColumns(null, "public", "account", "%")) {
                while (rs.next()) {
                    System.out.println("column: " + rs.getString("COLUMN_NAME") + " " + rs.getString("TYPE_NAME") + " size "
                        + rs.getInt("COLUMN_SIZE") + " digits " + rs.getInt("DECIMAL_DIGITS") + " nullable " + rs.getString("IS_NULLABLE"));
                }
            }
            try (ResultSet rs = meta.getPrimaryKeys(null, "public", "account")) {
                while (rs.next()) {
                    System.out.println("primary key: " + rs.getString("COLUMN_NAME"));
                }
            }
            // A fetch size needs a transaction: rows come in portions of a
            // suspended portal.
            c.setAutoCommit(false);
            try (Statement s = c.createStatement()) {
                s.setFetchSize(3);
                int n = 0;
                try (ResultSet rs = s.executeQuery("SELECT oid FROM orders ORDER BY oid")) {
                    while (rs.next()) {
                        n++;
                    }
                }
                System.out.println("fetch size 3: " + n + " rows");
            }
            c.commit();
        }
    }
}
