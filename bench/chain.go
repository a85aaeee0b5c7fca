package main

import (
	"context"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/middleware"
)

// ChainOverhead is what every healthy message pays for retry and recovery
// being available: the usual chain on the success path against the handler
// called directly. No broker is involved.
type ChainOverhead struct {
	Direct Micro `json:"direct"`
	Chain  Micro `json:"chain_retry5_recover"`
}

// Micro is one testing.Benchmark result.
type Micro struct {
	N           int     `json:"n"`
	NsPerOp     float64 `json:"ns_per_op"`
	AllocsPerOp int64   `json:"allocs_per_op"`
	BytesPerOp  int64   `json:"bytes_per_op"`
}

func handledAtOnce(context.Context, *amqp.Delivery) error { return nil }

// measureChain uses testing.Benchmark, which works outside go test: it picks
// the iteration count itself, as go test -bench would.
func measureChain() *ChainOverhead {
	r := middleware.RecovererFunc(func(context.Context, *amqp.Delivery, error) error { return nil })
	chained := middleware.Chain(middleware.Retry(5), middleware.Recover(r))(handledAtOnce)
	return &ChainOverhead{
		Direct: micro(handledAtOnce),
		Chain:  micro(chained),
	}
}

func micro(h middleware.Handler) Micro {
	res := testing.Benchmark(func(b *testing.B) {
		ctx, d := context.Background(), &amqp.Delivery{}
		b.ReportAllocs()
		for b.Loop() {
			_ = h(ctx, d)
		}
	})
	return Micro{
		N:           res.N,
		NsPerOp:     float64(res.T.Nanoseconds()) / float64(res.N),
		AllocsPerOp: res.AllocsPerOp(),
		BytesPerOp:  res.AllocedBytesPerOp(),
	}
}
