from deskpod.cli import main

raise SystemExit(main())
