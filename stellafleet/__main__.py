from stellafleet.cli import main

raise SystemExit(main())
