package client

// RetryWait is retryWait, for TestRetryWaitStaysWithinItsBounds.
var RetryWait = retryWait
