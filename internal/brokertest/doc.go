// Package brokertest connects tests to the real RabbitMQ broker: call Dial(t)
// at the top of any test that touches AMQP. Under `make test`
// (AMQPRETRY_REQUIRE_BROKER=1) a missing broker fails the test; elsewhere it
// skips it, so `go test ./...` still works on a laptop without RabbitMQ.
package brokertest
