from engram.cli import main

main()
