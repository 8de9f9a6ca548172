package cdc

import (
	"fmt"
	"net/url"
	"strings"
)

// OpenURI opens a source from its URI:
//
//	file:PATH             a newline-delimited JSON file, a directory of them
//	                      (read in name order), or file:- for stdin
//	kafka://HOST:PORT[,HOST:PORT…]?topics=T1,T2&group=G
//	kafka://HOST:PORT?topic_regex=^dbserver1\.&group=G
//	                      Debezium topics, the transaction topic included
//
// follow applies to file sources: keep reading the last file as it grows.
// resume gives, per stream, the first offset still to deliver: file
// sources skip what comes before, Kafka partitions start there.
func OpenURI(uri string, follow bool, resume map[string]int64) (Source, error) {
	scheme, rest, ok := strings.Cut(uri, ":")
	if !ok {
		return nil, fmt.Errorf("cdc: source %q: want file:PATH, kafka://BROKERS?topics=…, postgres://USER@HOST:PORT/DB or mysql://USER@HOST:PORT/DATABASE", uri)
	}
	switch scheme {
	case "file":
		path := strings.TrimPrefix(rest, "//")
		if path == "" {
			return nil, fmt.Errorf("cdc: source %q has no path", uri)
		}
		return OpenFileSource(path, FileOptions{Follow: follow, Resume: resume})
	case "kafka":
		u, err := url.Parse(uri)
		if err != nil {
			return nil, fmt.Errorf("cdc: source %q: %w", uri, err)
		}
		q := u.Query()
		opts := KafkaOptions{
			Brokers:    strings.Split(u.Host, ","),
			TopicRegex: q.Get("topic_regex"),
			Group:      q.Get("group"),
			Resume:     resume,
		}
		if t := q.Get("topics"); t != "" {
			opts.Topics = strings.Split(t, ",")
		}
		if u.Host == "" {
			return nil, fmt.Errorf("cdc: source %q has no brokers", uri)
		}
		return OpenKafka(opts)
	}
	return nil, fmt.Errorf("cdc: source %q: unknown scheme %q (file, kafka, postgres or mysql)", uri, scheme)
}

// RedactURL prints a database URI without its password (the user's, or a
// password parameter), for names kept on disk and in logs.
func RedactURL(u *url.URL) string {
	c := *u
	if c.User != nil {
		if _, has := c.User.Password(); has {
			c.User = url.UserPassword(c.User.Username(), "xxxxx")
		}
	}
	if q := c.Query(); q.Has("password") {
		q.Set("password", "xxxxx")
		c.RawQuery = q.Encode()
	}
	return c.String()
}
