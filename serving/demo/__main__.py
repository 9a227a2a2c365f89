from serving.demo.train import main

raise SystemExit(main())
