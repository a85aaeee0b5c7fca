// Command otel shows the traces amqpretry writes: a message fails twice, is
// retried, and succeeds; another fails for good and is republished to a DLQ.
// Spans go to stdout as JSON (process, attempt and send spans), metrics are
// read once at the end. It exits by itself.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/amqpretry/amqpretry/examples/internal/exampleutil"
	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/publisher"
	"github.com/amqpretry/amqpretry/recoverer"
)

func main() {
	url := os.Getenv("AMQP_URL")
	if url == "" {
		url = "amqp://guest:guest@127.0.0.1:5672/"
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Stdout, url); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, out io.Writer, url string) error {
	// Setting the global providers is all it takes: the listener, Retry,
	// Recover and the publisher all default to them.
	exporter, err := stdouttrace.New(stdouttrace.WithWriter(out), stdouttrace.WithPrettyPrint())
	if err != nil {
		return err
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exporter))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	otel.SetTracerProvider(tp)
	otel.SetMeterProvider(mp)
	otel.SetTextMapPropagator(propagation.TraceContext{})
	defer tp.Shutdown(context.Background())
	defer mp.Shutdown(context.Background())

	// The queues are this run's own, deleted when it ends.
	queue := exampleutil.Name("amqpretry.otel")
	dlq := queue + ".dlq"
	conn, ch, err := exampleutil.Connect(url)
	if err != nil {
		return err
	}
	defer conn.Close()
	for _, q := range []string{queue, dlq} {
		if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
			return err
		}
	}
	defer func() { _ = exampleutil.DeleteQueues(ch, queue, dlq) }()
	pub, err := publisher.New(url)
	if err != nil {
		return err
	}
	defer pub.Close()

	// A producer span, so the process span has something to link to.
	pctx, span := tp.Tracer("example-producer").Start(ctx, "send "+queue)
	for _, id := range []string{"flaky", "broken"} {
		if err := pub.Publish(pctx, "", queue, amqp.Publishing{MessageId: id, Body: []byte(id)}); err != nil {
			return err
		}
	}
	span.End()

	var flaky atomic.Int64
	handle := func(_ context.Context, d *amqp.Delivery) error {
		if d.MessageId == "broken" {
			return middleware.Permanent(errors.New("cannot parse order"))
		}
		if flaky.Add(1) < 3 {
			return errors.New("inventory service busy")
		}
		return nil
	}
	l, err := listener.New(queue,
		middleware.Chain(middleware.Retry(5, middleware.WithInitialInterval(50*time.Millisecond)), middleware.Recover(recoverer.Republish(pub, "", dlq))),
		handle, listener.WithURL(url), listener.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		return err
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- l.Run(runCtx) }()
	for deadline := time.Now().Add(10 * time.Second); l.Stats().Handled < 2; {
		if time.Now().After(deadline) {
			stop()
			<-done
			return fmt.Errorf("the two messages were not handled in time: %+v", l.Stats())
		}
		time.Sleep(20 * time.Millisecond)
	}
	stop()
	if err := <-done; err != nil {
		return err
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		return err
	}
	fmt.Fprintln(out, "metrics:")
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch data := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range data.DataPoints {
					fmt.Fprintf(out, "  %s{%s} = %d\n", m.Name, labels(p.Attributes), p.Value)
				}
			case metricdata.Histogram[float64]:
				for _, p := range data.DataPoints {
					fmt.Fprintf(out, "  %s{%s}: %d recorded, %.4fs in all\n", m.Name, labels(p.Attributes), p.Count, p.Sum)
				}
			}
		}
	}
	return nil
}

func labels(set attribute.Set) string {
	var parts []string
	for _, kv := range set.ToSlice() {
		parts = append(parts, string(kv.Key)+"="+kv.Value.Emit())
	}
	return strings.Join(parts, ", ")
}
