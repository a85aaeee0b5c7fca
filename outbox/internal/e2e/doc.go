// Package e2e proves the producer side end to end: orders written with their
// message in one transaction, two relay processes that publish them through
// cut connections, one SIGKILLed and restarted, a broker that restarts, and
// consumers that record their effects through the inbox. Every committed
// order's effect must be there exactly once, and a rolled-back order's never.
// It holds tests only; the test restarts the broker's app, so it needs the
// disruptive build tag and runs alone (make test runs it in the reliability
// phase, once per broker):
//
//	cd outbox && go test -tags disruptive -run OutboxEndToEnd -v ./internal/e2e
package e2e
