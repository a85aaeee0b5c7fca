package readme

import (
	"context"
	"log"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/dlx"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/publisher"
)

// Alerted is docs/dead-letters.md's OnRecover hook.
func Alerted(toDLQ middleware.Recoverer, alert func(context.Context, middleware.RecoverEvent)) middleware.Middleware {
	chain := middleware.Chain(middleware.Retry(5), middleware.Recover(toDLQ, middleware.OnRecover(alert)))
	return chain
}

// ReplayFromGo is docs/dead-letters.md's dlx.Replay.
func ReplayFromGo(ctx context.Context, conn *amqp.Connection, pub *publisher.Publisher) error {
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	stats, err := dlx.Replay(ctx, ch, pub, "orders.dlq", dlx.ReplayLimit(100))
	if err != nil {
		return err
	}
	log.Printf("replayed %d, %d left on the DLQ", stats.Replayed, stats.Skipped)
	return nil
}
