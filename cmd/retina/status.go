package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/retinadb/retina/internal/console"
)

func newStatusCommand() *cobra.Command {
	var addr, user string
	var asJSON, insecure bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Print what a running Retina does: the console's /api/status in a terminal",
		Long: `Print what a running Retina does: health, throughput, freshness, watermarks,
checkpoints, sources, tables and running statements, from the console's
/api/status on the server's HTTP endpoint (--http-addr). A server that
listens beyond loopback asks for a user of its SQL endpoint: --user and the
password in RETINA_SQL_PASSWORD.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			url := addr
			if !strings.Contains(url, "://") {
				url = "http://" + url
			}
			url = strings.TrimSuffix(url, "/") + "/api/status?since=" + fmt.Sprint(time.Now().Unix())
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
			if err != nil {
				return fmt.Errorf("status: %s: %w", url, err)
			}
			if user != "" {
				req.SetBasicAuth(user, os.Getenv("RETINA_SQL_PASSWORD"))
			}
			client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: insecure}}}
			resp, err := client.Do(req)
			if err != nil {
				return fmt.Errorf("status: is retina serving on %s? %w", addr, err)
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			if err != nil {
				return fmt.Errorf("status: %s: %w", url, err)
			}
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("status: %s answered %s: %s", url, resp.Status, strings.TrimSpace(string(body)))
			}
			if asJSON {
				_, err := cmd.OutOrStdout().Write(body)
				return err
			}
			var st console.Status
			if err := json.Unmarshal(body, &st); err != nil {
				return fmt.Errorf("status: %s sent no status document: %w", url, err)
			}
			printStatus(cmd.OutOrStdout(), &st)
			return nil
		},
	}
	cmd.Flags().StringVar(&addr, "http-addr", "127.0.0.1:9187", "the server's HTTP endpoint (host:port, or a URL for https)")
	cmd.Flags().StringVar(&user, "user", os.Getenv("RETINA_SQL_USER"), "a user of the SQL endpoint, when the server asks for one (password in RETINA_SQL_PASSWORD)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the status document as it is")
	cmd.Flags().BoolVar(&insecure, "insecure", false, "accept any TLS certificate")
	cmd.Flags().DurationVar(&timeout, "timeout", 10*time.Second, "give up after this long")
	return cmd
}

// printStatus renders the status document for a terminal.
func printStatus(out io.Writer, st *console.Status) {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	defer w.Flush()
	fmt.Fprintf(w, "retina %s, up %s: %s\n", st.Version, (time.Duration(st.Uptime) * time.Second).String(), st.Health)
	fmt.Fprintf(w, "throughput\t%.0f row changes/s, %.0f transactions/s\n", st.Rates.Rows, st.Rates.Transactions)
	fmt.Fprintf(w, "freshness\tP50 %.1f ms, P99 %.1f ms (%d transactions in the last second)\n", st.Freshness.P50, st.Freshness.P99, st.Freshness.Samples)
	wm := st.Watermarks
	fmt.Fprintf(w, "watermarks\tHWM %d, LWM %d (%.1f s old), %d in flight\n", wm.HWM, wm.LWM, wm.LWMAge, wm.HWMLag)
	if r := wm.OldestReader; r != nil {
		fmt.Fprintf(w, "holding LWM\tpid %d (%s): %s\n", r.PID, r.User, r.Query)
	}
	if c := st.Checkpoint; c.Count > 0 {
		fmt.Fprintf(w, "checkpoint\tat %d, %.1f s ago, took %.3f s (%d taken, %d failed)\n", c.TS, c.Age, c.Duration, c.Count, c.Errors)
	}
	rc := st.Recovery
	fmt.Fprintf(w, "last start\trestored checkpoint %d (clean: %v) in %.2f s; redoing: %v, %d transactions redone\n",
		rc.CheckpointTS, rc.Clean, rc.Seconds, rc.Redoing, rc.Redone)
	if st.DeadLetters.Count > 0 {
		fmt.Fprintf(w, "dead letters\t%d in %s\n", st.DeadLetters.Count, st.DeadLetters.File)
	}
	if st.Iceberg != nil {
		fmt.Fprintf(w, "iceberg\t%d publications, snapshot at %d, lag %.2f s, %d failures\n", st.Iceberg.Publications, st.Iceberg.SnapshotTS, st.Iceberg.Lag, st.Iceberg.Failures)
	}
	if o := st.OLTP; o != nil {
		fmt.Fprintf(w, "oltp\t%.0f commits/s, %d commits, %d aborts, %d memory and %d storage tables, %d commits not yet streamed\n",
			o.CommitsPerSec, o.Commits, o.Aborts, o.MemoryTables, o.StorageTables, o.StreamLagCommits)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "SOURCE\tSTATE\tPOSITION\tLAG\tEVENTS/S")
	for _, s := range st.Sources {
		state := s.State
		if s.Reason != "" {
			state += ": " + s.Reason
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%.1f s\t%.0f\n", s.Name, state, s.Position, s.LagSeconds, s.EventsPerSec)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "TABLE\tLIVE ROWS\tVERSIONS\tSTALE\tFILES (REGULAR/VIRTUAL)\tLAKE BYTES")
	tables := slices.Clone(st.Tables)
	slices.SortFunc(tables, func(a, b console.Table) int { return int(b.Versions - a.Versions) })
	for _, t := range tables {
		fmt.Fprintf(w, "%s\t%d\t%d\t%.1f%%\t%d/%d\t%d\n", t.Name, t.LiveRows, t.Versions, t.StaleShare*100, t.RegularFiles, t.VirtualFiles, t.LakeBytes)
	}
	if len(st.Queries) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintln(w, "PID\tUSER\tSTATE\tRUNNING\tSNAPSHOT AGE\tSTATEMENT")
		for _, q := range st.Queries {
			fmt.Fprintf(w, "%d\t%s\t%s\t%.1f s\t%.1f s\t%s\n", q.PID, q.User, q.State, q.Duration, q.SnapshotAge, q.Query)
		}
	}
}
