package outbox

import "database/sql"

// ComparePublishing is comparePublishing, for the external tests.
var ComparePublishing = comparePublishing

// EncodeProperties is encodeProperties, for tests that write a row as an
// older version of this package would have, bypassing Enqueue's checks.
var EncodeProperties = encodeProperties

// DB is the database the Outbox writes to.
func (o *Outbox) DB() *sql.DB { return o.db }
