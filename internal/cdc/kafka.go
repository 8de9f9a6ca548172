package cdc

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// KafkaOptions configure a Kafka source of a Debezium deployment.
type KafkaOptions struct {
	Brokers []string
	// Topics lists the topics to read (table topics and the transaction
	// topic), or TopicRegex matches them (e.g. `^dbserver1\.`).
	Topics     []string
	TopicRegex string
	// Group is the consumer group whose offsets Commit advances (default
	// "retina"). Offsets are committed only up to what is durably replayed,
	// so a restart redelivers the rest; the sink drops the duplicates.
	Group string
	// Resume gives, per stream (KafkaStream), the first offset to read: the
	// replay checkpoint's, which wins over the group's committed offsets
	// (they can lag it, or belong to an older run of the group).
	Resume map[string]int64
}

// KafkaSource consumes Debezium topics with franz-go.
type KafkaSource struct {
	cl       *kgo.Client
	pending  []*kgo.Record
	fetchErr error // reported after pending drains
}

// OpenKafka connects to the brokers and joins the consumer group.
func OpenKafka(opts KafkaOptions) (*KafkaSource, error) {
	if len(opts.Brokers) == 0 {
		return nil, fmt.Errorf("cdc: kafka source needs brokers")
	}
	if opts.Group == "" {
		opts.Group = "retina"
	}
	kopts := []kgo.Opt{
		kgo.SeedBrokers(opts.Brokers...),
		kgo.ConsumerGroup(opts.Group),
		kgo.DisableAutoCommit(),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
	}
	if len(opts.Resume) > 0 {
		resume := opts.Resume
		kopts = append(kopts, kgo.AdjustFetchOffsetsFn(func(_ context.Context, assigned map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
			for topic, parts := range assigned {
				for p := range parts {
					if off, ok := resume[KafkaStream(topic, p)]; ok {
						parts[p] = kgo.NewOffset().At(off).WithEpoch(-1)
					}
				}
			}
			return assigned, nil
		}))
	}
	switch {
	case opts.TopicRegex != "":
		if _, err := regexp.Compile(opts.TopicRegex); err != nil {
			return nil, fmt.Errorf("cdc: kafka topic regex: %w", err)
		}
		kopts = append(kopts, kgo.ConsumeRegex(), kgo.ConsumeTopics(opts.TopicRegex))
	case len(opts.Topics) > 0:
		kopts = append(kopts, kgo.ConsumeTopics(opts.Topics...))
	default:
		return nil, fmt.Errorf("cdc: kafka source needs topics or a topic regex")
	}
	cl, err := kgo.NewClient(kopts...)
	if err != nil {
		return nil, fmt.Errorf("cdc: kafka client: %w", err)
	}
	return &KafkaSource{cl: cl}, nil
}

// KafkaStream names a topic partition as a position stream.
func KafkaStream(topic string, partition int32) string {
	return "kafka:" + topic + "/" + strconv.Itoa(int(partition))
}

func parseKafkaStream(s string) (string, int32, bool) {
	rest, ok := strings.CutPrefix(s, "kafka:")
	if !ok {
		return "", 0, false
	}
	i := strings.LastIndexByte(rest, '/')
	if i < 0 {
		return "", 0, false
	}
	p, err := strconv.Atoi(rest[i+1:])
	return rest[:i], int32(p), err == nil
}

// Next returns the next record of any assigned partition.
//
// Records a poll returned are consumed as far as the client is concerned, so
// they are kept even when ctx ends during the poll; dropping them would lose
// them until the next restart. A fetch error is returned once the records
// that came with it are handed out.
func (s *KafkaSource) Next(ctx context.Context) (Message, error) {
	for len(s.pending) == 0 {
		if err := s.fetchErr; err != nil {
			s.fetchErr = nil
			return Message{}, err
		}
		if err := ctx.Err(); err != nil {
			return Message{}, err
		}
		fetches := s.cl.PollFetches(ctx)
		s.pending = fetches.Records()
		var errs []error
		fetches.EachError(func(t string, p int32, err error) {
			if cerr := ctx.Err(); cerr != nil && errors.Is(err, cerr) {
				return // the poll was cut short, not a fetch failure
			}
			errs = append(errs, fmt.Errorf("%s/%d: %w", t, p, err))
		})
		if len(errs) > 0 {
			s.fetchErr = fmt.Errorf("cdc: kafka fetch: %w", errors.Join(errs...))
		}
	}
	r := s.pending[0]
	s.pending = s.pending[1:]
	return Message{Pos: Position{Stream: KafkaStream(r.Topic, r.Partition), Offset: r.Offset}, Key: r.Key, Value: r.Value}, nil
}

// Commit commits, for every Kafka stream, the first offset not yet durably
// applied.
func (s *KafkaSource) Commit(ctx context.Context, resume map[string]int64) error {
	offsets := map[string]map[int32]kgo.EpochOffset{}
	for stream, off := range resume {
		topic, part, ok := parseKafkaStream(stream)
		if !ok {
			continue
		}
		if offsets[topic] == nil {
			offsets[topic] = map[int32]kgo.EpochOffset{}
		}
		offsets[topic][part] = kgo.EpochOffset{Epoch: -1, Offset: off}
	}
	if len(offsets) == 0 {
		return nil
	}
	var cerr error
	s.cl.CommitOffsetsSync(ctx, offsets, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		cerr = err
		if err != nil || resp == nil {
			return
		}
		for _, t := range resp.Topics {
			for _, p := range t.Partitions {
				if e := kerr.ErrorForCode(p.ErrorCode); e != nil {
					cerr = fmt.Errorf("%s/%d: %w", t.Topic, p.Partition, e)
				}
			}
		}
	})
	if cerr != nil {
		return fmt.Errorf("cdc: kafka commit: %w", cerr)
	}
	return nil
}

// Close leaves the group and closes the client.
func (s *KafkaSource) Close() error {
	s.cl.Close()
	return nil
}
