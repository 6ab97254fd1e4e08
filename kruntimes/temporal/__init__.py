"""Temporal plumbing: how to reach it (`settings`, no SDK), connecting (`connect`), the payload
codec (`codec`), the dev server the embedded platform and the tests run (`devserver`), and the
known-Runs view read from visibility (`known_runs`)."""
