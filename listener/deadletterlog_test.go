package listener_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/internal/testlog"
	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/recoverer"
)

// A downstream outage that dead-letters thousands of messages is not a log
// storm: the first dead letters of a burst are logged in full, then one
// summary line per interval says how many more, by error type; Stats still
// counts every one.
func TestDeadLetterFloodIsNotALogStorm(t *testing.T) {
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	dlq, recover := dlqFixture(t)
	const n = 2000
	msgs := make([]amqp.Publishing, n)
	for i := range msgs {
		msgs[i] = amqp.Publishing{MessageId: fmt.Sprint(i)}
	}
	brokertest.Publish(t, q, msgs...)
	var log testlog.Buffer
	r := start(t, q, recover, func(_ context.Context, d *amqp.Delivery) error {
		if d.MessageId[len(d.MessageId)-1] == '7' {
			return middleware.Permanent(fmt.Errorf("order %s: %w", d.MessageId, errBadOrder))
		}
		return errors.New("payment service unavailable")
	}, listener.WithLogger(log.Logger()), listener.WithPrefetch(100), listener.WithDeadLetterLog(5, 500*time.Millisecond))
	brokertest.Eventually(t, 60*time.Second, "every message dead-lettered", func() bool { return r.Stats().DeadLettered == n })
	brokertest.Eventually(t, 5*time.Second, "the last summary", func() bool { return summarized(log.String()) == n-countFull(log.String()) })
	r.Stop(t)
	full := countFull(log.String())
	lines := strings.Count(log.String(), "\n")
	t.Logf("%d dead letters: %d logged in full, %d log lines in all", n, full, lines)
	if lines > 60 {
		t.Errorf("%d log lines for %d dead letters, want a few dozen at most", lines, n)
	}
	if full < 5 {
		t.Errorf("%d dead letters logged in full, want the first 5 of the burst", full)
	}
	if brokertest.Depth(t, dlq) != n {
		t.Errorf("the DLQ holds %d, want %d", brokertest.Depth(t, dlq), n)
	}
	if !strings.Contains(log.String(), "by_error_type=") || !strings.Contains(log.String(), "listener_test.badOrder=") {
		t.Errorf("no summary names the error types with their counts:\n%s", log.String())
	}
}

type badOrder struct{}

func (badOrder) Error() string { return "bad order" }

var errBadOrder = badOrder{}

// countFull counts the dead letters logged one by one.
func countFull(log string) int { return strings.Count(log, "msg=\"listener: message dead-lettered\"") }

// summarized adds up the "more" of the dead letters' summary lines.
func summarized(log string) int { return summedMore(log, "dead-lettered") }

// summedMore adds up the "more" of the log lines that contain what.
func summedMore(log, what string) int {
	total := 0
	for _, line := range strings.Split(log, "\n") {
		if i := strings.Index(line, "more="); i >= 0 && strings.Contains(line, what) {
			var k int
			fmt.Sscanf(line[i+len("more="):], "%d", &k)
			total += k
		}
	}
	return total
}

// A flood that the chain hands back to the broker (Recover(recoverer.Reject())
// on a queue with its own dead-letter exchange) is not a log storm either:
// the warning for each failed message ("message failed") is limited as the
// dead letters' are, and Stats counts every one. Before, 2,000 rejects wrote
// 2,000 warnings.
func TestRejectFloodIsNotALogStorm(t *testing.T) {
	q, dlq := brokertest.Name(t, "q"), brokertest.Name(t, "dlq")
	brokertest.Queue(t, dlq, nil)
	brokertest.Queue(t, q, amqp.Table{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
	const n = 2000
	publishN(t, q, n)
	var log testlog.Buffer
	r := start(t, q, middleware.Chain(middleware.Recover(recoverer.Reject())), func(context.Context, *amqp.Delivery) error {
		return errors.New("payment service unavailable")
	}, listener.WithLogger(log.Logger()), listener.WithPrefetch(100), listener.WithDeadLetterLog(5, 500*time.Millisecond))
	brokertest.Eventually(t, 60*time.Second, "every message rejected", func() bool { return r.Stats().Rejected == n })
	failedInFull := func() int { return strings.Count(log.String(), `msg="listener: message failed"`) }
	brokertest.Eventually(t, 5*time.Second, "the last summary", func() bool { return summarizedFailures(log.String()) == n-failedInFull() })
	r.Stop(t)
	lines := strings.Count(log.String(), "\n")
	t.Logf("%d rejects: %d logged in full, %d log lines in all", n, failedInFull(), lines)
	if lines > 60 {
		t.Errorf("%d log lines for %d rejected messages, want a few dozen at most", lines, n)
	}
	if failedInFull() < 5 {
		t.Errorf("%d failures logged in full, want the first 5 of the burst", failedInFull())
	}
	if !strings.Contains(log.String(), "reject *errors.errorString=") {
		t.Errorf("no summary names the settlement and error type with their counts:\n%s", log.String())
	}
	brokertest.Eventually(t, 5*time.Second, "the broker's DLX routed every reject", func() bool { return brokertest.Depth(t, dlq) == n })
}

// summarizedFailures adds up the "more" of the failures' summary lines.
func summarizedFailures(log string) int { return summedMore(log, "more messages failed") }
