package outbox

// ComparePublishing is comparePublishing, for the external tests.
var ComparePublishing = comparePublishing
