package escape_test

import (
	"fmt"

	"github.com/amqpretry/amqpretry/cmd/amqpretry/internal/escape"
)

func ExampleLine() {
	// A bidi override that would show "exe.txt" as "txt.exe", an ANSI colour
	// and a byte that is not UTF-8: all shown, none acting.
	fmt.Println(escape.Line("invoice \u202etxt.exe \x1b[31mred\x1b[0m \xff naïve\nnext"))
	// Output: invoice \u202etxt.exe \x1b[31mred\x1b[0m \xff naïve\nnext
}

func ExampleBlock() {
	fmt.Println(escape.Block("line one\r\nline two\t<end>"))
	// Output:
	// line one\r
	// line two\t<end>
}
