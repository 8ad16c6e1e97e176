from fp8lab.cli import main

raise SystemExit(main())
