package outbox

import "database/sql"

// ComparePublishing is comparePublishing, for the external tests.
var ComparePublishing = comparePublishing

// EncodeProperties is encodeProperties, for tests that write a row as an
// older version of this package would have, bypassing Enqueue's checks.
var EncodeProperties = encodeProperties

// DB is the database the Outbox writes to.
func (o *Outbox) DB() *sql.DB { return o.db }

// AsyncPublisher is what a Relay publishes through asynchronously.
type AsyncPublisher = asyncPublisher

// PublishAsyncThrough makes r publish through p's PublishAsync, as it does
// through a bare *publisher.Publisher, so that the tests' wrappers (which
// count, hook or route) can watch the asynchronous path too.
func (r *Relay) PublishAsyncThrough(p AsyncPublisher) *Relay {
	r.async = p
	return r
}
