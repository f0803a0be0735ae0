//! Terminal output: progress bars on a terminal, plain lines otherwise.
