"""`python -m fleet` is the `fleet` command (the connection pool starts itself this way)."""

from fleet.launch import main

main()
