"""`python -m console` == `eagle3-console`."""

from console.cli import main

raise SystemExit(main())
