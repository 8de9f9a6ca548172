package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"
)

func newSQLCommand() *cobra.Command {
	var addr, user string
	var asJSON bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "sql QUERY",
		Short: "Run a query against a Retina SQL endpoint and print the rows",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			if timeout > 0 {
				var cancel func()
				ctx, cancel = context.WithTimeout(ctx, timeout)
				defer cancel()
			}
			conn, err := pgx.Connect(ctx, fmt.Sprintf("postgres://%s@%s/retina?sslmode=disable", user, addr))
			if err != nil {
				return fmt.Errorf("connect to %s: %w", addr, err)
			}
			defer conn.Close(ctx)
			rows, err := conn.Query(ctx, args[0], pgx.QueryExecModeSimpleProtocol)
			if err != nil {
				return err
			}
			defer rows.Close()
			var names []string
			for _, f := range rows.FieldDescriptions() {
				names = append(names, f.Name)
			}
			var out [][]any
			for rows.Next() {
				vals, err := rows.Values()
				if err != nil {
					return err
				}
				out = append(out, vals)
			}
			if err := rows.Err(); err != nil {
				return err
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), names, out)
			}
			return printTable(cmd.OutOrStdout(), names, out)
		},
	}
	cmd.Flags().StringVar(&addr, "addr", "127.0.0.1:5433", "SQL endpoint address")
	cmd.Flags().StringVar(&user, "user", "retina", "user name")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object per row")
	cmd.Flags().DurationVar(&timeout, "timeout", 0, "cancel the query after this long (0: no limit)")
	return cmd
}

func printTable(w io.Writer, names []string, rows [][]any) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(names, "\t"))
	seps := make([]string, len(names))
	for i, n := range names {
		seps[i] = strings.Repeat("-", max(len(n), 3))
	}
	fmt.Fprintln(tw, strings.Join(seps, "\t"))
	for _, r := range rows {
		cells := make([]string, len(r))
		for i, v := range r {
			cells[i] = cell(v)
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "(%d rows)\n", len(rows))
	return err
}

func cell(v any) string {
	switch x := v.(type) {
	case nil:
		return "NULL"
	case time.Time:
		return x.Format("2006-01-02 15:04:05.999999")
	case []byte:
		return fmt.Sprintf("\\x%x", x)
	case fmt.Stringer:
		return x.String()
	}
	if n, ok := v.(interface{ Value() (any, error) }); ok {
		if val, err := n.Value(); err == nil {
			return fmt.Sprint(val)
		}
	}
	return fmt.Sprint(v)
}

func printJSON(w io.Writer, names []string, rows [][]any) error {
	enc := json.NewEncoder(w)
	for _, r := range rows {
		obj := make(map[string]any, len(r))
		for i, v := range r {
			if s, ok := v.(fmt.Stringer); ok {
				obj[names[i]] = s.String()
			} else {
				obj[names[i]] = v
			}
		}
		if err := enc.Encode(obj); err != nil {
			return err
		}
	}
	return nil
}
