package main

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/amqpretry/amqpretry/listener"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// otel-floor claims to produce, per healthy delivery, what listener-otel
// produces: the same metric points with the same attribute sets and counts,
// and one span of the same name, kind and attribute keys. If the listener
// records something new per message, this fails until the floor does too.
func TestOTelFloorMatchesListener(t *testing.T) {
	url := requireBroker(t)
	b, err := dialBroker(url)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	cfg := defaultConfig()
	cfg.URL, cfg.Settle = url, 0
	e := &env{cfg: cfg, broker: b}
	const n = 40
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	listenerMetrics, listenerSpans := recordTelemetry(ctx, t, e, n, func(ctx context.Context, q string, sdk *otelSDK) (Sample, error) {
		return consumeWithListener(ctx, e, q, n, listener.WithTracerProvider(sdk.tp), listener.WithMeterProvider(sdk.mp))
	})
	floorMetrics, floorSpans := recordTelemetry(ctx, t, e, n, func(ctx context.Context, q string, sdk *otelSDK) (Sample, error) {
		return consumeOTelFloorWith(ctx, e, q, n, sdk)
	})

	// Not per message: the listener's consumers going up and down.
	delete(listenerMetrics, "amqpretry.consumers.active")
	if !maps.Equal(listenerMetrics, floorMetrics) {
		t.Errorf("metrics differ\nlistener:   %v\notel-floor: %v", listenerMetrics, floorMetrics)
	}
	if len(listenerSpans) != n || len(floorSpans) != n {
		t.Fatalf("spans: listener %d, otel-floor %d, want %d each", len(listenerSpans), len(floorSpans), n)
	}
	if l, f := spanShape(listenerSpans[0]), spanShape(floorSpans[0]); l != f {
		t.Errorf("spans differ\nlistener:   %s\notel-floor: %s", l, f)
	}
}

// recordTelemetry fills a queue with n messages, consumes it with the
// providers of a fresh otelSDK whose spans are recorded, and returns the
// metrics (by name and attribute set, the queue's name replaced by
// <queue>) and the spans.
func recordTelemetry(ctx context.Context, t *testing.T, e *env, n int, consume func(context.Context, string, *otelSDK) (Sample, error)) (map[string]string, []sdktrace.ReadOnlySpan) {
	t.Helper()
	q := uniqueName("otelfloor-test")
	cleanup, err := e.broker.queues(q)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := cleanup(); err != nil {
			t.Error(err)
		}
	}()
	if err := e.broker.fill(ctx, q, n); err != nil {
		t.Fatal(err)
	}
	spans := tracetest.NewSpanRecorder()
	reader := sdkmetric.NewManualReader()
	sdk := &otelSDK{
		tp:     sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithSpanProcessor(spans)),
		mp:     sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)),
		reader: reader,
	}
	defer func() {
		if err := sdk.shutdown(ctx); err != nil {
			t.Error(err)
		}
	}()
	if _, err := consume(ctx, q, sdk); err != nil {
		t.Fatal(err)
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			var points []string
			switch data := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range data.DataPoints {
					points = append(points, fmt.Sprintf("%s=%d", attrString(p.Attributes, q), p.Value))
				}
			case metricdata.Histogram[float64]:
				for _, p := range data.DataPoints {
					points = append(points, fmt.Sprintf("%s count %d, bounds %v", attrString(p.Attributes, q), p.Count, p.Bounds))
				}
			default:
				points = append(points, fmt.Sprintf("%T", data))
			}
			slices.Sort(points)
			got[m.Name] = m.Unit + " " + strings.Join(points, "; ")
		}
	}
	return got, spans.Ended()
}

func attrString(set attribute.Set, q string) string {
	var kvs []string
	for _, kv := range set.ToSlice() {
		kvs = append(kvs, string(kv.Key)+"="+strings.ReplaceAll(kv.Value.Emit(), q, "<queue>"))
	}
	return "{" + strings.Join(kvs, ",") + "}"
}

// spanShape is a span's name (the queue replaced), kind and sorted
// attribute keys.
func spanShape(s sdktrace.ReadOnlySpan) string {
	var keys []string
	for _, kv := range s.Attributes() {
		keys = append(keys, string(kv.Key))
	}
	slices.Sort(keys)
	name := s.Name()
	if i := strings.IndexByte(name, ' '); i >= 0 {
		name = name[:i] + " <queue>"
	}
	return fmt.Sprintf("%q %s %v", name, s.SpanKind(), keys)
}
