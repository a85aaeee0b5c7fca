package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/amqpretry/amqpretry/listener"
)

// Sections of the run, and the throughput variants, by the names -skip takes.
const (
	sectionThroughput = "throughput"
	sectionPoison     = "poison"
	sectionSchedule   = "schedule"
	sectionScale      = "scale"
	sectionChain      = "chain"
	sectionOutbox     = "outbox"
	sectionRetry      = "retry"
	sectionBatch      = "batch"
	sectionCoalesce   = "coalesce"
	sectionSlow       = "slow"
	// partRetryMemory is the retry section's parked-messages part, which
	// -skip can leave out alone.
	partRetryMemory = "retry-memory"
)

var sections = []string{sectionThroughput, sectionCoalesce, sectionPoison, sectionSchedule, sectionScale, sectionSlow, sectionChain, sectionOutbox, sectionRetry, sectionBatch}

// Config is everything one run needs. main fills it from flags; the smoke
// test fills it with tiny numbers.
type Config struct {
	URL            string
	Rounds         int
	Messages       int // per throughput run
	PoisonMessages int // per poison-flood run; 0: as Messages
	ScaleBacklog   int
	SlowMessages   int // per slow-handlers run
	Consumers      int
	Prefetch       int
	// Settle is the pause after filling a queue: the broker is still
	// deleting the previous run's queue and paging messages in.
	Settle time.Duration
	// DSN is the PostgreSQL of the outbox section.
	DSN string
	// OutboxMessages is the backlog each outbox throughput run drains;
	// OutboxLatencyMessages the orders of the latency run; OutboxBody the
	// bytes of each message's body.
	OutboxMessages        int
	OutboxLatencyMessages int
	OutboxBody            int
	Out                   string          // where results.json and throughput.png go
	Skip                  map[string]bool // section and variant names
	Stdout                io.Writer       // the markdown report
	Log                   io.Writer       // progress
	// Profile, when set, is the directory where every throughput and
	// poison-flood run writes a CPU and an allocation profile.
	Profile string

	// RetryURL is the RabbitMQ 4.3 broker of the retry section; RetryCtl
	// the rabbitmqctl command that reaches its node, split at spaces.
	RetryURL string
	RetryCtl string
	// RetryMessages is the messages of each retry-flood run, RetryParked
	// those parked in a long delay for the memory measurement.
	RetryMessages int
	RetryParked   int

	// BatchMessages is the messages of each batch-section run (on the
	// PostgreSQL of DSN too).
	BatchMessages int
}

func defaultConfig() Config {
	return Config{
		URL:    defaultURL,
		Rounds: 5,
		// A happy-path run of 30000 lasts half a second on a quick
		// machine, and its rounds spread by a third; 100000 bring that
		// to about a tenth. The poison flood is slower per message:
		// 30000 already take seconds.
		Messages:              100000,
		PoisonMessages:        30000,
		ScaleBacklog:          3000,
		SlowMessages:          2000, // 20 ms each, 8 at a time: 5 s a run at best, the pool's growth a small part of it
		Consumers:             2,
		Prefetch:              listener.DefaultPrefetch,
		Settle:                time.Second,
		DSN:                   defaultDSN,
		OutboxMessages:        20000,
		OutboxLatencyMessages: 500,
		OutboxBody:            128,
		Out:                   "results",
		Skip:                  map[string]bool{},

		RetryURL: defaultRetryURL,
		RetryCtl: defaultRetryCtl,
		// Each message of the flood is delivered or attempted three
		// times: 20000 make a run of a few seconds.
		RetryMessages: 20000,
		RetryParked:   100000,

		// One INSERT per message runs at a few thousand a second on a
		// laptop's PostgreSQL: 20000 make a run of a few seconds.
		BatchMessages: 100000,
	}
}

// parseSkip reads -skip's comma list and rejects names it does not know, so
// that a typo does not silently run everything.
func parseSkip(list string) (map[string]bool, error) {
	known := append(append(append(append(slices.Clone(sections), variantNames()...), coalesceVariantNames()...), retryVariantNames()...), batchVariantNames()...)
	skip := map[string]bool{}
	for _, name := range strings.Split(list, ",") {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		if !slices.Contains(known, name) {
			return nil, fmt.Errorf("-skip: unknown name %q; known: %s", name, strings.Join(known, ", "))
		}
		skip[name] = true
	}
	return skip, nil
}

func (c Config) validate() error {
	switch {
	case c.Rounds < 1:
		return fmt.Errorf("-rounds expects at least 1, got %d", c.Rounds)
	case c.Messages < 1:
		return fmt.Errorf("-messages expects at least 1, got %d", c.Messages)
	case c.PoisonMessages < 0:
		return fmt.Errorf("-poison-messages expects at least 0 (as -messages), got %d", c.PoisonMessages)
	case c.ScaleBacklog < 1:
		return fmt.Errorf("-scale-backlog expects at least 1, got %d", c.ScaleBacklog)
	case c.SlowMessages < 1:
		return fmt.Errorf("-slow-messages expects at least 1, got %d", c.SlowMessages)
	case c.OutboxMessages < 1:
		return fmt.Errorf("-outbox-messages expects at least 1, got %d", c.OutboxMessages)
	case c.BatchMessages < 1:
		return fmt.Errorf("-batch-messages expects at least 1, got %d", c.BatchMessages)
	case c.OutboxBody < 0:
		return fmt.Errorf("-outbox-body expects 0 bytes or more, got %d", c.OutboxBody)
	case c.OutboxLatencyMessages < 1:
		return fmt.Errorf("-outbox-latency-messages expects at least 1, got %d", c.OutboxLatencyMessages)
	case c.RetryMessages < 1:
		return fmt.Errorf("-retry-messages expects at least 1, got %d", c.RetryMessages)
	case c.RetryParked < 1:
		return fmt.Errorf("-retry-parked expects at least 1, got %d", c.RetryParked)
	case c.Out == "":
		return fmt.Errorf("-out expects a directory")
	}
	return nil
}

// poisonMessages is the poison flood's count: raw and listener move the
// same number.
func (c Config) poisonMessages() int {
	if c.PoisonMessages == 0 {
		return c.Messages
	}
	return c.PoisonMessages
}

// logf writes a progress line.
func (c Config) logf(format string, args ...any) {
	if c.Log != nil {
		fmt.Fprintf(c.Log, "bench: "+format+"\n", args...)
	}
}
