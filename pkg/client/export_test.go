package client

// RetryWait is retryWait, for TestRetryWaitStaysWithinItsBounds.
var RetryWait = retryWait

// RetryAfterHeader is retryAfterHeader, for TestRetryAfterHeaderReadsDigitsAndDates.
var RetryAfterHeader = retryAfterHeader
