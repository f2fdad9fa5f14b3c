from aistack.cli import main

raise SystemExit(main())
