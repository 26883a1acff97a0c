//! cachet-api: the `cachet` service and command line.
