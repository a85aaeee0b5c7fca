package readme

import (
	"time"

	"github.com/amqpretry/amqpretry/middleware"
)

// LongHandlers is docs/consumer-timeout.md's chain with a Timeout per attempt.
func LongHandlers(toDLQ middleware.Recoverer) middleware.Middleware {
	chain := middleware.Chain(middleware.Retry(3), middleware.Recover(toDLQ), middleware.Timeout(2*time.Minute))
	return chain
}
