package outbox_test

import (
	"context"
	"database/sql"
	"strconv"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/outbox"
)

// The relay's rate from a backlog of committed rows to messages confirmed
// and marked sent, and raw confirmed publishing with as many in flight,
// for the ratio (go test -run '^$' -bench . ./ in outbox/).
func BenchmarkRelay(b *testing.B) {
	ob, db, q := benchSetup(b)
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		b.Fatal(err)
	}
	for i := range b.N {
		if _, err := ob.Enqueue(ctx, tx, "", q, amqp.Publishing{MessageId: strconv.Itoa(i), Body: make([]byte, 256)}); err != nil {
			b.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		b.Fatal(err)
	}
	pub := newPublisher(b)
	b.ResetTimer()
	began := time.Now()
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- ob.Relay(pub).Run(runCtx) }()
	for {
		var pending int
		if err := db.QueryRow(`SELECT count(*) FROM ` + ob.Table() + ` WHERE status <> 'sent'`).Scan(&pending); err != nil {
			b.Fatal(err)
		}
		if pending == 0 {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	b.ReportMetric(float64(b.N)/time.Since(began).Seconds(), "msg/s")
	cancel()
	<-done
}

func BenchmarkRawConfirmedPublish(b *testing.B) {
	_, _, q := benchSetup(b)
	pub := newPublisher(b)
	ctx := context.Background()
	sem := make(chan struct{}, 1000) // the relay's default: 2 workers of 500
	var wg sync.WaitGroup
	b.ResetTimer()
	began := time.Now()
	for i := range b.N {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := pub.Publish(ctx, "", q, amqp.Publishing{MessageId: strconv.Itoa(i), Body: make([]byte, 256)}); err != nil {
				b.Error(err)
			}
		}()
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/time.Since(began).Seconds(), "msg/s")
}

func benchSetup(b testing.TB) (*outbox.Outbox, *sql.DB, string) {
	b.Helper()
	ob, db, _ := setup(b)
	q := brokertest.Name(b, "q")
	brokertest.Queue(b, q, amqp.Table{"x-max-length": int64(1000), "x-overflow": "drop-head"})
	return ob, db, q
}
